"""Fault injection for the failure-isolation tests of a real server (hidden `ortinf serve` options).

A request is data and the engine loop infrastructure: the tests need a request that passes every
check at the edge and still fails inside a step, and an engine whose every step fails. Both are
made here by wrapping the model runner's `execute`, the same place a real ORT failure surfaces.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortinf.runtime.model_runner import ModelRunner
from ortinf.runtime.scheduler_output import ModelRunnerOutput, SchedulerOutput


@dataclass(frozen=True, slots=True)
class FaultInjection:
    """`after_steps`: every graph call from that engine step on fails (an engine fault).
    `token_id`: a call that computes this token id fails (a poisoned request)."""

    after_steps: int | None = None
    token_id: int | None = None

    @property
    def active(self) -> bool:
        return self.after_steps is not None or self.token_id is not None

    def install(self, runner: ModelRunner) -> None:
        original = runner.execute
        calls = 0

        def execute(scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
            nonlocal calls
            if scheduler_output.scheduled:
                calls += 1
                if self.after_steps is not None and calls >= self.after_steps:
                    raise RuntimeError(f"injected engine fault (graph call {calls})")
                if self.token_id is not None and any(self.token_id in s.token_ids for s in scheduler_output.scheduled):
                    raise RuntimeError(f"injected fault: token id {self.token_id} in the step")
            return original(scheduler_output)

        runner.execute = execute  # type: ignore[method-assign]
