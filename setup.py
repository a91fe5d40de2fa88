"""Builds ortinf's CPU kernel library into the wheel where a C++ compiler and ONNX Runtime's C API
headers can be had (ortinf/kernels/build.py says from where); without them the wheel is pure Python and
CPU packages run the portable kernel. Everything else about the package is in pyproject.toml."""

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithKernels(build_py):
    def run(self) -> None:
        super().run()
        spec = importlib.util.spec_from_file_location("ortinf_kernels_build", HERE / "ortinf" / "kernels" / "build.py")
        builder = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(builder)
        try:
            path = builder.build(out_dir=Path(self.build_lib) / "ortinf" / "kernels" / "lib")
            print(f"ortinf: built {path.name}", file=sys.stderr)
        except builder.BuildError as exc:
            print(f"warning: ortinf's CPU kernel library is not in this wheel (CPU packages will run the portable "
                  f"kernel): {exc}", file=sys.stderr)


setup(cmdclass={"build_py": BuildPyWithKernels})
