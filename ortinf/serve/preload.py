"""Opening the served package while the server's own modules import.

`ortinf serve PKG` used to import the app (FastAPI, every API's routes, uvicorn: 0.35-0.45 s on the 2-core EPYC) and
only then open the package (ORT's session, the KV pool, the tokenizer, a warm-up step: 1.3-1.5 s at 1.5B int4). ORT
creates its session with the GIL released, so the package opens on a thread of its own from the moment the options
are checked, and `load_model` takes the opened package when the app asks for it (measured: a 1.5B int4 package opened
and the app imported in 1.63-1.87 s, 1.97-2.90 s one after the other). Only the plain case: one package, no
--models-dir, no LoRA adapters (their slots depend on which package is the LoRA base, decided at load).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ortinf.tasks.kinds import Task

_pending: dict[tuple[str, str], tuple[dict, Future]] = {}


def start(package: Path, name: str, options: dict) -> None:
    """Opens `package` as load_model would (open_package with the server's options and a warm-up), on a thread."""
    future: Future = Future()

    def run() -> None:
        started = time.perf_counter()
        try:
            from ortinf.serve.model_manager import resident_bytes  # on this thread: the caller goes on importing
            from ortinf.tasks.package import open_package

            resident = resident_bytes()

            future.set_result((open_package(package, options, explicit=False, warm_up=True, name=name), started, resident))
        except BaseException as exc:  # noqa: BLE001 - load_model raises it, where loading errors are handled
            future.set_exception(exc)

    _pending[(str(package), name)] = (dict(options), future)
    threading.Thread(target=run, name="ortinf-preload", daemon=True).start()


def take(package: Path, name: str, options: dict) -> tuple[Task, float, float] | None:
    """The package `start` opened, with when it started and the resident bytes then; None when none was started for
    it with these options. Waits for it; its error is raised here."""
    entry = _pending.pop((str(package), name), None)
    if entry is None:
        return None
    wanted, future = entry
    opened = future.result()
    if wanted != options:  # not what the app asks for (never expected): the app opens it again
        opened[0].close()
        return None
    return opened
