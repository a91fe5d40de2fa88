"""Fault injection for the failure-isolation tests: a test hook, never in the serving path.

A request is data and the engine loop infrastructure: the tests need a request that passes every
check at the edge and still fails inside a step, and an engine whose every step fails. Both are
made by wrapping the model runner's `execute`, the place a real ORT failure surfaces.

In-process: `FaultInjection(...).install(runner)`. For a real server process: run this file as
`python tests/support/fault_injection.py serve ...` with ORTINF_TEST_FAIL_AFTER_STEPS or
ORTINF_TEST_FAIL_TOKEN_ID set; it patches every ModelRunner and then runs the `ortinf` CLI.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ortinf.runtime.worker.model_runner import ModelRunner
from ortinf.runtime.worker.scheduler_output import ModelRunnerOutput, SchedulerOutput


@dataclass(frozen=True, slots=True)
class FaultInjection:
    """`after_steps`: every graph call from that engine step on fails (an engine fault).
    `token_id`: a call that computes this token id fails (a poisoned request; for an encoder-decoder,
    a source that holds it)."""

    after_steps: int | None = None
    token_id: int | None = None

    def wrap(self, execute):
        calls = 0

        def faulty(*args) -> ModelRunnerOutput:  # (scheduler_output) bound, (runner, scheduler_output) on the class
            nonlocal calls
            scheduler_output: SchedulerOutput = args[-1]
            if scheduler_output.scheduled:
                calls += 1
                if self.after_steps is not None and calls >= self.after_steps:
                    raise RuntimeError(f"injected engine fault (graph call {calls})")
                if self.token_id is not None and any(self._poisoned(s) for s in scheduler_output.scheduled):
                    raise RuntimeError(f"injected fault: token id {self.token_id} in the step")
            return execute(*args)

        return faulty

    def _poisoned(self, scheduled) -> bool:  # a ScheduledRequest
        encoder = scheduled.encoder_input
        return self.token_id in scheduled.token_ids or (encoder is not None and self.token_id in encoder.data)

    def install(self, runner: ModelRunner) -> None:
        """On one runner (an engine built in the test's own process)."""
        runner.execute = self.wrap(runner.execute)  # type: ignore[method-assign]

    def install_everywhere(self) -> None:
        """On every ModelRunner of this process (a server started from `main`; the graph calls of all
        its models count together)."""
        ModelRunner.execute = self.wrap(ModelRunner.execute)  # type: ignore[method-assign]


def main() -> None:
    def number(name: str) -> int | None:
        value = os.environ.get(name)
        return int(value) if value else None

    FaultInjection(number("ORTINF_TEST_FAIL_AFTER_STEPS"), number("ORTINF_TEST_FAIL_TOKEN_ID")).install_everywhere()
    from ortinf.cli import main as cli

    sys.argv[0] = "ortinf"
    cli()


if __name__ == "__main__":
    main()
