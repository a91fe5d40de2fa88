"""The one driver of programs over the engine, synchronously (`run`, over LLMEngine.step) and
asynchronously (`stream`, over the AsyncEngine's thread).

A program (ortinf/tasks/programs.py) is a request kind above the engine: n samples of one prompt, a
beam search, a Whisper job's windows. It starts with some prepared requests and, each time one of
them advances, says what to hand to its caller and which requests come next. The driver owns
everything else, once: request ids, adding and aborting, the error path (a program that raises ends
with that error and its other requests are aborted; other programs go on), and progress.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ortinf.runtime.engine.async_engine import Channel

if TYPE_CHECKING:
    from ortinf.runtime.engine.async_engine import AsyncEngine
    from ortinf.runtime.engine.llm_engine import LLMEngine
    from ortinf.runtime.engine.outputs import RequestOutput
    from ortinf.tasks.programs import Program


def run(engine: LLMEngine, programs: Sequence[Program], on_step: Callable[[], None] | None = None) -> None:
    """Runs every program to its end on `engine`, together (their requests batch with each other); raises the
    first program's error after aborting every request still running (the engine stays usable).
    `on_step` runs after each engine step (a progress bar)."""
    outputs = steps(engine, programs, on_step)
    try:
        for _ in outputs:
            pass
    finally:
        outputs.close()


def steps(engine: LLMEngine, programs: Sequence[Program],
          on_step: Callable[[], None] | None = None) -> Iterator[tuple[int, Any, RequestOutput]]:
    """`run`, yielding (program index, handed key, output) as the programs hand outputs out (a terminal's
    streamed reply). Closing it early, or an exception in the caller's loop (Ctrl-C), aborts the requests."""
    ids = itertools.count()
    owner: dict[str, tuple[int, Any]] = {}  # engine request id -> (program index, the program's key)

    def launch(index: int, requests: Sequence[tuple[Any, Any]]) -> None:
        for key, prepared in requests:
            request_id = f"p{index}-{next(ids)}"
            owner[request_id] = (index, key)
            engine.add_request(prepared, request_id=request_id)

    try:
        for index, program in enumerate(programs):
            launch(index, program.start())
        while owner:
            for output in engine.step():
                found = owner.get(output.request_id)
                if found is None:
                    continue
                outcome: RequestOutput | BaseException = output.error if output.error is not None else output
                if output.error is not None or output.finished:
                    del owner[output.request_id]
                index, key = found
                handed, following = programs[index].advance(key, outcome)
                launch(index, following)
                for handed_key, handed_output in handed:
                    yield index, handed_key, handed_output
            if on_step is not None:
                on_step()
    except BaseException:
        for request_id in owner:
            engine.abort(request_id)
        raise


async def stream(engine: AsyncEngine, program: Program, request_id: str) -> AsyncIterator[tuple[Any, RequestOutput]]:
    """Runs one program on the async engine, yielding what it hands out as its requests advance (a sample's
    deltas, a search's n best). The program's error is raised here; closing the stream early (a client that
    went away) aborts the program's requests. A program whose `advance` is slow (Whisper's word timing) runs
    it off the event loop."""
    channel = Channel(engine)
    ids = itertools.count()
    keys: dict[str, Any] = {}

    def launch(requests: Sequence[tuple[Any, Any]]) -> None:
        for key, prepared in requests:
            engine_id = f"{request_id}-{next(ids)}"
            keys[engine_id] = key
            channel.add(engine_id, prepared)

    try:
        launch(program.start())
        while channel.open:
            for engine_id, item in (await channel.take()).items():
                ended = isinstance(item, BaseException) or item.finished
                key = keys.pop(engine_id) if ended else keys[engine_id]
                if program.blocking and ended:
                    handed, following = await asyncio.to_thread(program.advance, key, item)
                else:
                    handed, following = program.advance(key, item)
                launch(following)
                for pair in handed:
                    yield pair
    finally:
        channel.close()


async def finish(engine: AsyncEngine, program: Program, request_id: str) -> None:
    """Runs one program to its end on the async engine (what it hands out is in its own state)."""
    outputs = stream(engine, program, request_id)
    try:
        async for _ in outputs:
            pass
    finally:
        await outputs.aclose()


__all__ = ["finish", "run", "steps", "stream"]
