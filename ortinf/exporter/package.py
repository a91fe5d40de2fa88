"""Writing the package folder atomically, with its tokenizer, chat template and generation config.

Everything is written into a hidden staging folder beside OUT, renamed onto OUT only once the export
has verified; a failed or interrupted export leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ortinf.errors import ExportError
from ortinf.exporter.source import ModelSource
from ortinf.manifest import MANIFEST_NAME

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model")
CHAT_TEMPLATE = "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"


def check_output(out: Path, overwrite: bool) -> None:
    """Refuses an existing, non-empty OUT unless --overwrite, and even then unless it holds an ortinf
    package (--overwrite never deletes anything else); refuses a file, and the current folder or a
    folder holding it (the package is renamed into place, which would move the working directory)."""
    out = out.resolve()
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is a file: choose another output folder")
    cwd = Path.cwd().resolve()
    if out == cwd or out in cwd.parents:
        raise ExportError(f"{out} is the current folder or holds it: write the package into a new folder, e.g. -o pkg")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ExportError(f"{out} already exists: pass --overwrite to replace it, or choose another folder")
        if not (out / MANIFEST_NAME).is_file():
            raise ExportError(f"{out} is not an ortinf package (it has no {MANIFEST_NAME}): --overwrite replaces only "
                              "packages; choose another folder")


@contextlib.contextmanager
def staging(out: Path, overwrite: bool) -> Iterator[Path]:
    """Yields a staging folder; on success it replaces `out`, on any failure it is removed."""
    check_output(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(out)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    (stage / OWNER).write_text(f"{socket.gethostname()} {os.getpid()}\n")
    try:
        yield stage
        (stage / OWNER).unlink(missing_ok=True)
        publish_modes(stage)
        if out.exists():
            if exchange(stage, out):  # one atomic step: `out` is never missing (stage now holds the old package)
                return
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, trash / "old")
            os.replace(stage, out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


OWNER = ".owner"  # in a staging folder: "<host> <pid>" of the export writing it


def remove_abandoned(out: Path) -> None:
    """Removes the staging folders of earlier exports to `out` whose process is gone (killed, or the
    machine restarted): a failed export cleans up after itself, a killed one cannot. A folder whose
    owner runs on another host, or is still alive, is left alone."""
    for stage in out.parent.glob(f".{out.name}.partial-*"):
        try:
            host, pid = (stage / OWNER).read_text().split()
        except (OSError, ValueError):
            continue  # not ours to judge: no owner file (an older ortinf's, or being created)
        if host != socket.gethostname():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running
        except ProcessLookupError:
            shutil.rmtree(stage, ignore_errors=True)
        except (PermissionError, ValueError):
            continue


RENAME_EXCHANGE = 2  # linux/fs.h


def exchange(a: Path, b: Path) -> bool:
    """Swaps two paths atomically (Linux renameat2 RENAME_EXCHANGE), so that a server starting while
    an --overwrite export lands finds the old package or the new one, never no folder. False where the
    kernel, the C library or the filesystem cannot: the caller then renames twice."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:  # glibc < 2.28
        return False
    at_fdcwd = -100
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE) == 0


def publish_modes(folder: Path) -> None:
    """Gives the package the modes of a folder made with mkdir, per the umask (typically 755/644):
    mkdtemp makes the staging folder 700 and temporary files are 600, which would leave the package
    (and the shared package cache) readable by its owner only."""
    mask = os.umask(0)
    os.umask(mask)
    folder.chmod(0o777 & ~mask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def write_tokenizer(source: ModelSource, stage: Path, vocab_size: int | None) -> tuple[bool, bool]:
    """Saves the tokenizer (as tokenizer.json) and its chat template; returns (has_tokenizer, has_template).

    A tokenizer whose ids do not fit the model's `vocab_size` is refused."""
    if not any((source.path / name).exists() for name in TOKENIZER_FILES):
        return False, False
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path)
    except Exception as exc:  # any tokenizer failure is reported, not raised through
        raise ExportError(f"the tokenizer in {source.path} cannot be loaded ({exc}); fix or remove its files") from exc
    tokenizer.save_pretrained(stage)
    if not (stage / "tokenizer.json").exists():
        raise ExportError(f"the tokenizer in {source.path} has no fast (tokenizer.json) form, which the runtime needs")
    from tokenizers import Tokenizer

    from ortinf.tokenizer import vocab_mismatch

    mismatch = None if vocab_size is None else vocab_mismatch(Tokenizer.from_file(str(stage / "tokenizer.json")), int(vocab_size))
    if mismatch is not None:
        raise ExportError(f"{source.path}: {mismatch}; nothing was written")
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and not (stage / CHAT_TEMPLATE).exists():
        (stage / CHAT_TEMPLATE).write_text(template, encoding="utf-8")
    return True, (stage / CHAT_TEMPLATE).exists()


def write_generation_config(source: ModelSource, stage: Path) -> dict[str, Any]:
    """Copies generation_config.json (or derives one from config.json); returns its content."""
    src = source.path / GENERATION_CONFIG
    if src.is_file():
        try:
            data = json.loads(src.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ExportError(f"{src} is not valid JSON ({exc.msg}); fix or delete it") from exc
    else:
        keys = ("bos_token_id", "eos_token_id", "pad_token_id")
        data = {k: source.config[k] for k in keys if source.config.get(k) is not None}
    (stage / GENERATION_CONFIG).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return data


def token_ids(value: Any) -> tuple[int, ...]:
    """An id field that may be missing, an int or a list, as a tuple of ints."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def versions() -> dict[str, str]:
    """The versions an export records in its manifest."""
    import onnx
    import onnxruntime
    import torch
    import transformers

    import ortinf

    return {
        "ortinf": ortinf.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }
