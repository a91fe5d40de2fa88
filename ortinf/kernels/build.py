"""Builds ortinf's CPU kernel library (ortinf/kernels/cpu/*.cc) into ortinf/kernels/lib/libortinf_kernels.so.

    python -m ortinf.kernels.build            (scripts/install.sh runs it; setup.py too, for wheels)

The sources need ONNX Runtime's C API header, `onnxruntime_c_api.h`, which no onnxruntime wheel
ships. It comes from, in order:

1. `ORTINF_ORT_INCLUDE`: a folder holding it (an ORT release archive's include/, a source tree);
2. build/ort-headers/, filled once from Debian trixie's `libonnxruntime-dev` (ORT 1.21's headers),
   fetched with apt-get into private folders (its own sources list and state: the system's apt
   configuration is not touched) and unpacked with `dpkg -x`;
3. neither: one warning line, and no library. CPU packages then run on the portable kernel.

The library asks ORT for C API 17, so headers of 1.17 or newer build one binary for every ORT from
1.17 on. Each attention translation unit is compiled once per instruction set (AVX-512, AVX2,
baseline x86-64), each quantized-MatMul one once per integer dot-product flavour (AVX512_VNNI,
AVX-VNNI, AVX2, baseline), and the library picks the widest the CPU has when it loads.

Torch-free and import-light: it runs before anything else is installed.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "cpu"
LIB_DIR = HERE / "lib"
LIB_NAME = "libortinf_kernels.so"
HEADER = "onnxruntime_c_api.h"
DEBIAN_SUITE = "deb http://deb.debian.org/debian trixie main"
DEBIAN_PACKAGE = "libonnxruntime-dev"

COMMON = ["-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden", "-Wall", "-pthread"]
# The dot products must be allowed to reassociate to vectorise; only the attention files get this,
# and not -ffast-math: the online softmax relies on -inf staying -inf.
MATH = ["-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros"]
ISA_FLAGS = {
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c", "-mprefer-vector-width=512"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "generic": [],
}
# The quantized MatMul's builds (qmatmul_impl.h): VNNI's vpdpbusd in 512-bit (AVX512_VNNI) and
# 256-bit (AVX-VNNI) form, AVX2's vpmaddubsw, and the portable loops.
QMATMUL_ISA_FLAGS = {
    "avx512vnni": ISA_FLAGS["avx512"] + ["-mavx512vnni"],
    "avxvnni": ISA_FLAGS["avx2"] + ["-mavxvnni"],
    "avx2": ISA_FLAGS["avx2"],
    "generic": [],
}


class BuildError(RuntimeError):
    """The library could not be built; the message says what to install or set."""


def find_headers(cache: Path) -> Path:
    """The folder holding onnxruntime_c_api.h (see the module docstring for the order)."""
    configured = os.environ.get("ORTINF_ORT_INCLUDE")
    if configured:
        folder = Path(configured).expanduser()
        for candidate in (folder, folder / "onnxruntime"):
            if (candidate / HEADER).is_file():
                return candidate
        raise BuildError(f"ORTINF_ORT_INCLUDE={configured} holds no {HEADER}")
    cached = cache / "usr" / "include" / "onnxruntime"
    if (cached / HEADER).is_file():
        return cached
    return fetch_debian_headers(cache)


def fetch_debian_headers(cache: Path) -> Path:
    """Downloads and unpacks Debian trixie's libonnxruntime-dev into `cache` (about 90 kB)."""
    if not shutil.which("apt-get") or not shutil.which("dpkg"):
        raise BuildError(f"no {HEADER}: set ORTINF_ORT_INCLUDE to a folder with ONNX Runtime's C API headers "
                         "(apt-get, to fetch Debian's libonnxruntime-dev, is not on this machine)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "lists" / "partial").mkdir(parents=True)
        (root / "archives" / "partial").mkdir(parents=True)
        (root / "sources.list").write_text(DEBIAN_SUITE + "\n")
        options = [f"-oDir::Etc::sourcelist={root / 'sources.list'}", "-oDir::Etc::sourceparts=-",
                   f"-oDir::State::Lists={root / 'lists'}", f"-oDir::Cache::Archives={root / 'archives'}",
                   f"-oDir::Cache={root}", "-oAPT::Sandbox::User=root", "-qq"]
        for command in (["apt-get", *options, "update"], ["apt-get", *options, "download", DEBIAN_PACKAGE]):
            done = subprocess.run(command, cwd=root, capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise BuildError(f"no {HEADER}: fetching Debian's {DEBIAN_PACKAGE} failed ({last}); "
                                 "set ORTINF_ORT_INCLUDE to a folder with ONNX Runtime's C API headers")
        debs = sorted(root.glob(f"{DEBIAN_PACKAGE}_*.deb"))
        if not debs:
            raise BuildError(f"no {HEADER}: apt-get downloaded no {DEBIAN_PACKAGE}")
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg", "-x", str(debs[-1]), str(cache)], check=True)
    headers = cache / "usr" / "include" / "onnxruntime"
    if not (headers / HEADER).is_file():
        raise BuildError(f"Debian's {DEBIAN_PACKAGE} held no {HEADER}")
    return headers


def library_units(register: Path = SOURCES / "register.cc") -> list[str]:
    """The units compiled once with the baseline flags: register.cc's "units:" line, where an op is registered."""
    for line in register.read_text().splitlines():
        if line.startswith("// units:"):
            return line.split(":", 1)[1].split()
    raise BuildError(f"{register} has no '// units:' line naming the library's units")


def compiler() -> str:
    for name in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        if name and shutil.which(name):
            return name
    raise BuildError("no C++ compiler (g++ or clang++) found: install one, or run on the portable kernel")


def build(out_dir: Path = LIB_DIR, cache: Path | None = None, verbose: bool = False) -> Path:
    """Compiles the library into out_dir; returns its path. Raises BuildError."""
    cache = cache or HERE.parents[1] / "build" / "ort-headers"
    include = find_headers(cache)
    cxx = compiler()
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    isas = list(ISA_FLAGS) if x86 else ["generic"]
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        objects = []
        dot = x86 and compiles(cxx, SOURCES / "panel_gemm_avx512bf16.cc", ISA_FLAGS["avx512"] + ["-mavx512bf16"], include, tmp)
        units = [(SOURCES / f"{name}.cc", ["-DORTINF_NO_BF16_DOT"] if name == "panel_gemm" and not dot else [])
                 for name in library_units()]  # panel_gemm.cc without the bf16 dot products: a compiler without AVX512_BF16
        units += [(SOURCES / f"attention_{isa}.cc", MATH + ISA_FLAGS[isa]) for isa in isas]
        # no reassociation in the panel GEMMs: a row's sums must not depend on how many rows share its block
        units += [(SOURCES / f"panel_gemm_{isa}.cc", ISA_FLAGS[isa]) for isa in isas]
        if dot:  # BMatMul on bf16 dot products (vdpbf16ps), picked at load where the CPU has AVX512_BF16
            units.append((SOURCES / "panel_gemm_avx512bf16.cc", ISA_FLAGS["avx512"] + ["-mavx512bf16"]))
        units += [(SOURCES / f"qmatmul_{isa}.cc", MATH + QMATMUL_ISA_FLAGS[isa]) for isa in QMATMUL_ISA_FLAGS
                  if x86 or isa == "generic"]
        for source, flags in units:
            obj = Path(tmp) / (source.stem + ".o")
            command = [cxx, *COMMON, *flags, f"-I{include}", f"-I{SOURCES}", "-c", str(source), "-o", str(obj)]
            if verbose:
                print(" ".join(command), file=sys.stderr)
            run(command)
            if flags:
                check_no_shared_code(obj, source.name)
            objects.append(str(obj))
        target = out_dir / LIB_NAME
        partial = out_dir / (LIB_NAME + ".partial")
        run([cxx, "-shared", "-pthread", "-o", str(partial), *objects])
        os.replace(partial, target)  # a reader never sees half a library
    return target


def compiles(cxx: str, source: Path, flags: list[str], include: Path, tmp: str) -> bool:
    """Whether this compiler builds `source` under `flags` (an older one may lack an instruction set's intrinsics)."""
    done = subprocess.run([cxx, *COMMON, *flags, f"-I{include}", f"-I{SOURCES}", "-c", str(source), "-o", str(Path(tmp) / "probe.o")],
                          capture_output=True, text=True)
    return done.returncode == 0


def check_no_shared_code(obj: Path, name: str) -> None:
    """A per-ISA object may define no weak symbol: the linker keeps one copy of each for the whole
    library (a std::vector member compiled with AVX-512 ran on AVX2-only CPUs: SIGILL). Skipped when
    binutils' nm is missing."""
    if not shutil.which("nm"):
        return
    listed = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True)
    shared = [line.split(" ", 2)[2] for line in listed.stdout.splitlines() if line[17:19] in ("W ", "V ", "u ")]
    if shared:
        raise BuildError(f"{name} defines code the linker would share across instruction sets: {', '.join(shared[:3])} "
                         "(keep per-ISA files free of out-of-line templates such as std::vector)")


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"{Path(command[0]).name} failed on {command[-3] if '-c' in command else 'the link'}:\n{done.stderr.strip()}")


def main() -> int:
    verbose = "-v" in sys.argv[1:]
    try:
        path = build(verbose=verbose)
    except BuildError as exc:
        print(f"warning: ortinf's CPU kernel library was not built, CPU packages will run the portable kernel: {exc}",
              file=sys.stderr)
        return 0 if "--strict" not in sys.argv[1:] else 1
    print(f"built {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
