"""The models folder of `ortinf serve --models-dir DIR`: what is under DIR (a package, a Hugging Face folder or a GGUF
file per model), what each is (read once per change of its files, in a worker thread) and the export of a folder or a
GGUF into DIR/.ortinf/NAME in a child process. ModelManager (model_manager.py) loads and unloads them.

Why a survey: a listing (/v1/models, /api/tags) must not touch the disk on the event loop (3,000 folders: 4.4 s per
call, the whole server frozen) nor fail for everyone because one folder went away or one manifest is wrong. So each
entry's facts (task, context length, size, digest, or what is wrong with it) are computed in a worker thread and kept
until its files' modification times change; a listing reads only those facts. The folder itself is rescanned when its
own modification time changes (a model added or removed)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ortinf.serve.errors import APIError

log = logging.getLogger(__name__)

EXPORTS = ".ortinf"  # DIR/.ortinf/NAME: the package exported from a Hugging Face folder or a GGUF under DIR
GONE = "its files were removed from the models folder"
PROGRESS_EVERY = 10.0  # seconds between two log lines of one export stage's progress
RECHECK = 2.0  # seconds a listing may show an entry's facts without looking at its files again (a folder added or removed shows at once)


@dataclass(frozen=True, slots=True)
class Facts:
    """What a listing shows of an entry, read from its files (no disk access once read)."""

    task: str = "unknown"
    max_model_len: int = 0
    model_type: str = ""
    dtype: str = ""
    size: int = 0
    modified: float = 0.0  # the manifest's (else the source's) modification time
    digest: str = ""
    error: str | None = None  # why it cannot be served (its requests get this; listings mark it)
    gone: bool = False  # its source is no longer there


@dataclass(slots=True)
class Entry:
    """A model under --models-dir: its name (the folder's or the GGUF's stem), its source and its package."""

    name: str
    source: Path
    kind: str  # "package", "hf" or "gguf"
    facts: Facts | None = None
    stamp: tuple | None = None  # the modification times `facts` were read at

    @property
    def package(self) -> Path:
        return self.source if self.kind == "package" else self.source.parent / EXPORTS / self.name

    @property
    def exported(self) -> bool:
        return (self.package / "ortinf.json").is_file()

    def size(self) -> int:
        """Bytes of its package (of its source before it is exported), as last surveyed."""
        return self.read().size

    def describe(self) -> dict:
        """What /v1/models shows of it before it loads: its task and context length where the package says."""
        facts = self.read()
        return {"task": facts.task, "max_model_len": facts.max_model_len, "model_type": facts.model_type, "dtype": facts.dtype}

    def read(self) -> Facts:
        """Its facts as last surveyed (read now, blocking, if never: a listing surveys first)."""
        return self.facts if self.facts is not None else self.refresh()

    def refresh(self) -> Facts:
        """Reads its facts again if its files changed since (blocking: a worker thread's). A stat or two per entry when
        nothing changed; never raises: what is wrong becomes `error`."""
        try:
            stamp = self._stamp()
        except OSError:
            self.facts, self.stamp = Facts(error=GONE, gone=True), None
            return self.facts
        if stamp != self.stamp or self.facts is None:
            self.facts, self.stamp = self._read(), stamp
        return self.facts

    def _stamp(self) -> tuple:
        # the source's own time (a folder's changes when a file is added or removed, a GGUF's when rewritten), and the
        # package's manifest's (written last by an export; rewritten by a re-export)
        source = self.source.stat()
        manifest = self.package / "ortinf.json"
        try:
            stat = manifest.stat()
            written = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            written = None
        return source.st_mtime_ns, source.st_size, written

    def _read(self) -> Facts:
        from ortinf.manifest import Manifest

        where = self.package if self.exported else self.source
        size = _size(where)
        manifest = self.package / "ortinf.json"
        try:
            modified = (manifest if manifest.is_file() else self.source).stat().st_mtime
            if not manifest.is_file():
                if self.kind == "package":
                    return Facts(size=size, modified=modified, error="its ortinf.json is gone: re-export the package")
                return Facts(task="text-generation" if self.kind == "gguf" else "unknown", size=size, modified=modified,
                             digest=hashlib.sha256(str(self.source).encode()).hexdigest())
            raw = manifest.read_bytes()
            loaded = Manifest.load(self.package)
            spec = loaded.decoder or loaded.encoder
            length = spec.max_model_len if spec is not None else 0
            if not isinstance(length, int) or isinstance(length, bool):  # the manifest's loader does not check types
                raise ValueError(f"max_model_len is {length!r}, not a whole number")
            return Facts(task=str(loaded.task), max_model_len=length, model_type=str(loaded.model_type or ""), dtype=str(loaded.dtype or ""),
                         size=size, modified=modified, digest=hashlib.sha256(raw).hexdigest())
        except FileNotFoundError:
            return Facts(error=GONE, gone=not self.source.exists())
        except Exception as exc:  # noqa: BLE001 - any wrong shape (`[]`, `7`, a string for a number) is this entry's error alone
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            return Facts(size=size, error=f"its ortinf.json is not a valid manifest ({reason})")


def _size(where: Path) -> int:
    """Bytes of a file, or of the files under a folder (0 for what vanishes while it is counted)."""
    if where.is_file():
        try:
            return where.stat().st_size
        except OSError:
            return 0
    total = 0
    for root, _, files in os.walk(where):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def discover(folder: Path) -> dict[str, Entry]:
    """The models directly under `folder`: packages (ortinf.json), Hugging Face folders (config.json), GGUF files."""
    if not folder.is_dir():
        raise APIError(400, f"--models-dir {folder}: no such folder")
    found: dict[str, Entry] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        try:
            if path.is_dir() and (path / "ortinf.json").is_file():
                found[path.name] = Entry(path.name, path, "package")
            elif path.is_dir() and (path / "config.json").is_file():
                found[path.name] = Entry(path.name, path, "hf")
            elif path.is_file() and path.suffix.lower() == ".gguf":
                found[path.stem] = Entry(path.stem, path, "gguf")
        except OSError:  # removed while it was looked at
            continue
    return found


class ModelsFolder:
    """The entries under DIR, kept current: rescanned when DIR's modification time changes, each entry's facts read
    again when its own files change. `entries` is replaced whole (never changed in place): the event loop reads it
    while a worker thread surveys."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, Entry] = discover(path)
        self.stamp = self._stamp()
        self._survey: asyncio.Future | None = None
        self.checked = float("-inf")  # when every entry's files were last looked at

    def _stamp(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    def rescan(self) -> None:
        """Finds models added to or removed from DIR (blocking); an entry that stays keeps its facts."""
        stamp = self._stamp()
        if stamp == self.stamp:
            return
        try:
            found = discover(self.path)
        except (APIError, OSError):
            log.warning("--models-dir %s is gone: no model is listed until it is back", self.path)
            found = {}
        old = self.entries
        self.entries = {name: old[name] if name in old and (old[name].source, old[name].kind) == (e.source, e.kind) else e
                        for name, e in found.items()}
        self.stamp = stamp

    def survey(self) -> None:
        """Rescans DIR and reads the facts of new entries; every entry's files are looked at again at most every
        RECHECK seconds (a stat or two each: 3,000 entries, ~40 ms of the GIL per listing otherwise). Blocking: a worker
        thread's. A request looks at its own entry's files every time (ModelManager._entry)."""
        self.rescan()
        full = time.monotonic() - self.checked >= RECHECK
        for entry in list(self.entries.values()):
            if full or entry.facts is None:
                entry.refresh()
        if full:
            self.checked = time.monotonic()

    async def surveyed(self) -> dict[str, Entry]:
        """The entries, surveyed off the event loop; listings that come while one survey runs share it."""
        if self._survey is None:
            self._survey = asyncio.ensure_future(asyncio.to_thread(self.survey))
            self._survey.add_done_callback(lambda _: setattr(self, "_survey", None))
        await asyncio.shield(self._survey)
        return self.entries


# The export child: `ortinf -v export SOURCE -o PACKAGE`, at a lower priority than the server's own work, and ended by
# the kernel if the server's process goes (PR_SET_PDEATHSIG: no export left running after a SIGKILL of the server).
CHILD = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)
    if os.getppid() != int(sys.argv[1]):
        sys.exit(1)
    os.nice(10)
except (OSError, AttributeError):
    pass
from ortinf.cli import main
sys.argv = ["ortinf", "-v", "export", sys.argv[2], "-o", sys.argv[3]]
main()
"""


class Progress:
    """The export child's output as server log lines: its progress bar (`tracing ███▌ 2/4 [00:01]`, rewritten in
    place) once per stage and at most every PROGRESS_EVERY seconds within one; every other line as it is."""

    BAR = re.compile(r"^([a-z][a-z ]*?)\s+[^\x00-\x7f ]*\s*(\d+)/(\d+)\s+\[([^\]]*)\]$")

    def __init__(self, name: str) -> None:
        self.name, self.stage, self.at = name, "", 0.0

    def feed(self, line: str) -> None:
        bar = self.BAR.match(line)
        if bar is None:
            log.info("export '%s': %s", self.name, line)
            return
        stage, done, total, elapsed = bar.groups()
        now = time.monotonic()
        if stage != self.stage or now - self.at >= PROGRESS_EVERY or done == total:
            self.stage, self.at = stage, now
            log.info("export '%s': %s %s/%s [%s]", self.name, stage, done, total, elapsed)


async def export_in_child(entry: Entry) -> None:
    """Exports a Hugging Face folder or a GGUF into its package in a child process (the exporter's torch and the
    model's weights, ~400 MiB, would otherwise stay in the server for good), its output in the server log line by line.
    Raises RuntimeError with the child's last line when it fails."""
    started = time.monotonic()
    log.info("exporting '%s' from %s into %s, in a child process (once: later loads read the package)", entry.name, entry.source,
             entry.package)
    entry.package.parent.mkdir(parents=True, exist_ok=True)
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, str(os.getpid()), str(entry.source), str(entry.package),
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                 stdin=asyncio.subprocess.DEVNULL)
    last, progress = "", Progress(entry.name)
    try:
        assert child.stdout is not None
        pending = ""
        while chunk := await child.stdout.read(4096):
            pending += chunk.decode(errors="replace")
            *lines, pending = re.split(r"[\r\n]", pending)  # the progress bar rewrites its line with \r
            for line in filter(None, (line.strip() for line in lines)):
                last = line
                progress.feed(line)
        code = await child.wait()
    except asyncio.CancelledError:  # the server stops: the half-done export goes with it (the exporter writes no partial package)
        child.terminate()
        raise
    if code != 0 or not entry.exported:
        raise RuntimeError(f"its export failed (exit {code}): {last[:200]}")
    log.info("exported '%s' in %.1f s", entry.name, time.monotonic() - started)


__all__ = ["EXPORTS", "Entry", "Facts", "ModelsFolder", "discover", "export_in_child"]
