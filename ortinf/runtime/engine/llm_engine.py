"""LLMEngine: the synchronous engine. One step is three calls: schedule, execute, update. What a request needs
before it is added is input_processor.py's (prepare, tokenize); what the engine is built of, engine_builder.py's;
this module holds the loop and its state: add_request, step, abort, the failure isolation, LoRA loads, stats."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ortinf.config import EngineConfig
from ortinf.errors import ConfigError, RequestError, StepFailedError
from ortinf.runtime.core.request import FinishReason, Request
from ortinf.runtime.core.stopping import Verdict, judge
from ortinf.runtime.engine.engine_builder import build
from ortinf.runtime.engine.output_processor import OutputProcessor
from ortinf.runtime.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from ortinf.runtime.engine.prepared import PreparedRequest
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.sample.structured_output import one_line
from ortinf.runtime.worker.lora import LoraAdapter
from ortinf.runtime.worker.scheduler_output import ModelRunnerOutput, SchedulerOutput

log = logging.getLogger(__name__)


class LLMEngine:
    """Owns the scheduler, the KV cache manager, the model runner and the output processor (each made by
    engine_builder.build, kept here under the names the tasks, the server and the tests read), and steps them."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        parts = build(config)
        self.manifest, self.tokenizer, self.max_model_len = parts.manifest, parts.tokenizer, parts.max_model_len
        self.graph, self.loras, self.kv_cache, self.scheduler = parts.graph, parts.loras, parts.kv_cache, parts.scheduler
        self.grammars, self.runner, self.draft, self.inputs = parts.grammars, parts.runner, parts.draft, parts.inputs
        self.num_failed_steps_in_a_row = 0
        self._lora_loads = 0
        self._lora_keys = {name: f"{name}#0" for name in self.lora_names()}  # name -> its identity in prefix-cache keys
        self.outputs = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    def wait_until_resident(self) -> None:
        """Returns once the KV pool's memory is mapped (a large pool is mapped in the background: kv_pool.py)."""
        self.graph.pool.wait_until_resident()

    def close(self) -> None:
        """Writes out what the prefix store still has queued (the engine's thread has stopped)."""
        if self.kv_cache.store is not None:
            self.kv_cache.store.close()

    def add_lora(self, name: str, path: str | Path | LoraAdapter) -> None:
        """Loads a PEFT LoRA folder under `name`, or an adapter already read with LoraAdapter.load (the
        server reads it off the engine thread, which then only writes its slot); ConfigError says
        what is wrong."""
        if self.loras is None:
            raise ConfigError("no LoRA slots: start the engine with max_loras >= 1 (--max-loras) on a package exported with --enable-lora")
        self.loras.add(path if isinstance(path, LoraAdapter) else LoraAdapter.load(name, path, self.graph.spec))
        self._lora_loads += 1
        self._lora_keys[name] = f"{name}#{self._lora_loads}"

    def remove_lora(self, name: str) -> None:
        """Unloads an adapter; refused while a request uses it."""
        if self.loras is None or name not in self.loras.adapters:
            raise ConfigError(f"no LoRA adapter named '{name}' is loaded")
        users = [r.request_id for r in self.scheduler.requests.values() if r.lora_key == self._lora_keys.get(name) and not r.is_finished]
        if users:
            raise ConfigError(f"LoRA '{name}' is in use by {len(users)} request(s): unload it once they finish")
        self.loras.remove(name)
        self._lora_keys.pop(name, None)

    def lora_names(self) -> list[str]:
        return self.inputs.lora_names()

    def _draft_proposals(self) -> dict[str, list[int]]:
        """The draft model's proposals for this step's decoding requests; none when it fails (the
        step then runs without speculation: the target's output never depends on the draft)."""
        candidates = self.scheduler.speculation_candidates()
        if not candidates:
            return {}
        try:
            return self.draft.propose([(r.request_id, r.all_token_ids, limit) for r, limit in candidates])
        except Exception as exc:  # noqa: BLE001
            log.warning("the draft model failed (%s: %s): this step runs without proposals", type(exc).__name__, exc)
            return {}

    def tokenize(self, prompt: str | Sequence[int], add_special_tokens: bool = True) -> tuple[str | None, list[int]]:
        """(prompt text or None, token ids): InputProcessor.tokenize."""
        return self.inputs.tokenize(prompt, add_special_tokens)

    def prepare(self, prompt: str | Sequence[int], params: SamplingParams | None = None, lora_name: str | None = None, *,
                add_special_tokens: bool = True, priority: int = 0, cache_salt: str | None = None,
                images: Sequence[object] = (), output_kind: str = "cumulative") -> PreparedRequest:
        """A tokenised, validated request, engine state untouched (safe from any thread): InputProcessor.prepare."""
        return self.inputs.prepare(prompt, params, lora_name, add_special_tokens=add_special_tokens, priority=priority,
                                   cache_salt=cache_salt, images=images, output_kind=output_kind)

    def add_request(self, prompt: str | Sequence[int] | PreparedRequest, params: SamplingParams | None = None, request_id: str | None = None,
                    lora_name: str | None = None) -> str:
        """Queues a request; raises RequestError (nothing queued) when it is invalid."""
        prepared = prompt if isinstance(prompt, PreparedRequest) else self.prepare(prompt, params, lora_name)
        if prepared.lora_name is not None and prepared.lora_name not in self._lora_keys:  # unloaded since prepare()
            raise RequestError(f"no LoRA adapter named '{prepared.lora_name}' is loaded", param="model")
        if prepared.options.whisper_timestamps is not None and self.manifest.speech is None:
            raise RequestError("Whisper's decoding rules are for speech-recognition packages", param="prompt")
        request = Request(
            request_id=request_id if request_id is not None else str(next(self._ids)),
            prompt_token_ids=prepared.token_ids,
            sampling_params=prepared.params,
            eos_token_ids=self.manifest.eos_token_ids,
            arrival_time=time.monotonic(),
            lora_slot=self.loras.slot(prepared.lora_name) if self.loras is not None else -1,
            lora_key=self._lora_keys.get(prepared.lora_name) if prepared.lora_name is not None else None,
            encoder_input=prepared.encoder_input,
            priority=prepared.priority,
            salt=prepared.cache_salt,
            images=prepared.images,
            options=prepared.options,
        )
        for token in prepared.output_token_ids:  # a beam's tokens so far: the rules (min_tokens, forced EOS) count them
            request.append_output_token(token)
        self.scheduler.add_request(request)
        self.outputs.add_request(request, prepared.text)
        return request.request_id

    def step(self) -> list[RequestOutput]:
        """Runs one engine step; returns outputs of the requests that advanced or finished.

        Failure isolation: an exception while scheduling, running or sampling fails only the
        requests it can be blamed on (a finished output carrying `error`; their blocks are freed)
        and the engine stays usable. `num_failed_steps_in_a_row` lets the caller decide when
        failures are no longer explained by requests (see AsyncEngine).
        """
        if self.draft is not None:
            self.scheduler.proposals = self._draft_proposals()
        try:
            scheduler_output = self.scheduler.schedule()
        except Exception as exc:  # noqa: BLE001 - nothing was scheduled: every unfinished request is a suspect
            return self._fail_step([r.request_id for r in (*self.scheduler.running, *self.scheduler.waiting)], exc, "scheduling")
        if self.draft is not None:
            self.draft.release(scheduler_output.finished_request_ids)
        results: list[RequestOutput] = []
        try:
            try:
                runner_output = self.runner.execute(scheduler_output)
            except Exception as exc:  # noqa: BLE001 - find the requests at fault, keep the others
                scheduler_output, runner_output, results = self._execute_one_by_one(scheduler_output, exc)
            verdicts, misjudged = self._judge(scheduler_output, runner_output)
            changed = self.scheduler.update_from_output(scheduler_output, runner_output, verdicts)
            self.outputs.record_prompt_logprobs(runner_output)
        except Exception as exc:  # noqa: BLE001 - the step's requests end; the engine goes on
            return results + self._fail_step([s.request_id for s in scheduler_output.scheduled], exc, "running")
        for request_id, reason in runner_output.cannot_continue.items():
            results += self._fail_requests([request_id], RequestError(f"the output cannot continue: {one_line(reason)}"), "sampling")
        for request_id, exc in misjudged.items():
            results += self._fail_requests([request_id], exc, "detokenizing")
        now = time.monotonic()
        for request in changed:
            try:
                self.outputs.record_step(request, runner_output, now)
                output = self._emit(request)
                if output is not None:  # None: a final_only request that has not finished
                    results.append(output)
            except Exception as exc:  # noqa: BLE001 - one request's output must not fail the others
                results += self._fail_requests([request.request_id], exc, "detokenizing")
        self.num_failed_steps_in_a_row = 0
        return results

    def _execute_one_by_one(self, scheduler_output: SchedulerOutput,
                            exc: Exception) -> tuple[SchedulerOutput, ModelRunnerOutput, list[RequestOutput]]:
        """After a failed step: runs each request of the step alone, so that only the ones that fail
        alone are failed. Re-running is safe: nothing was committed (the K/V of the same slots is
        written again, the scheduler has not advanced, and the model runner put back the random
        generators and grammar matchers its sampling had advanced before the failure). When every
        request fails, the step counts as failed (see `num_failed_steps_in_a_row`)."""
        scheduled = scheduler_output.scheduled
        merged = ModelRunnerOutput()
        kept, failed = [], []
        for item in scheduled if len(scheduled) > 1 else ():
            try:
                # the step's frees were applied by the batched call (before anything in it can fail): a solo call that
                # freed them again would drop an image an earlier solo call encoded for the same step
                output = self.runner.execute(replace(scheduler_output, scheduled=(item,), finished_request_ids=frozenset(),
                                                     free_image_digests=()))
            except Exception as alone:  # noqa: BLE001
                failed.append((item.request_id, alone))
                continue
            kept.append(item)
            merged.sampled_token_ids.update(output.sampled_token_ids)
            merged.logprobs.update(output.logprobs)
            merged.prompt_logprobs.update(output.prompt_logprobs)
            merged.format_complete.update(output.format_complete)
            merged.cannot_continue.update(output.cannot_continue)
            merged.candidates.update(output.candidates)
            merged.watched.update(output.watched)
        if not kept:  # nothing ran: the step failed as a whole
            raise exc
        results = []
        for request_id, alone in failed:
            results += self._fail_requests([request_id], alone, "running")
        return replace(scheduler_output, scheduled=tuple(kept)), merged, results

    def _judge(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> tuple[dict, dict[str, Exception]]:
        """Each sampled request's verdict (ortinf/runtime/core/stopping.py: the one place that decides that a
        request has finished), and the requests whose judging failed (they fail alone)."""
        verdicts, failed = {}, {}
        for scheduled in scheduler_output.scheduled:
            request_id = scheduled.request_id
            request = self.scheduler.requests.get(request_id)
            if not scheduled.sample or request is None or request.is_finished or request_id in runner_output.cannot_continue:
                continue
            try:
                verdict = judge(request, runner_output.sampled_token_ids.get(request_id, []), self.outputs.detokenizer(request_id),
                                self.max_model_len, request_id in runner_output.format_complete)
                verdicts[request_id] = self._forced_eos_is_length(request, verdict)
            except Exception as exc:  # noqa: BLE001
                failed[request_id] = exc
        return verdicts, failed

    def _forced_eos_is_length(self, request: Request, verdict: Verdict) -> Verdict:
        """An encoder-decoder whose generation config forces EOS as the last token the length allows
        (BART, Marian) ended for its length, not by choice: finish_reason "length", as OpenAI says when
        max_tokens cut the output."""
        rules, max_tokens = self.runner.rules, request.sampling_params.max_tokens
        if (rules is None or rules.forced_eos is None or verdict.finish_reason is not FinishReason.STOP or verdict.stop_reason is not None
                or max_tokens is None or request.num_output_tokens + verdict.keep < max_tokens):
            return verdict
        return Verdict(verdict.keep, FinishReason.LENGTH)

    def _fail_step(self, request_ids: list[str], exc: Exception, stage: str) -> list[RequestOutput]:
        self.num_failed_steps_in_a_row += 1
        return self._fail_requests(request_ids, exc, stage)

    def _fail_requests(self, request_ids: list[str], exc: Exception, stage: str) -> list[RequestOutput]:
        """Ends the requests with an error output each and frees their blocks."""
        log.error("engine step failed while %s requests %s: %s: %s", stage, ", ".join(request_ids[:8]), type(exc).__name__, exc,
                  exc_info=exc)
        error = exc if isinstance(exc, RequestError) else StepFailedError(
            f"the engine failed while {stage} this request ({type(exc).__name__}: {str(exc)[:200]}); other requests are unaffected", exc)
        results = []
        for request_id in request_ids:
            request = self.scheduler.requests.get(request_id)
            if request is None:
                continue
            self.scheduler.finish_request(request_id, FinishReason.ABORT)
            self.outputs.remove(request_id)
            self.scheduler.release(request_id)
            if self.draft is not None:
                self.draft.release([request_id])
            completion = CompletionOutput(0, "", list(request.output_token_ids), FinishReason.ABORT.value)
            results.append(RequestOutput(request_id, None, request.prompt_token_ids, [completion], finished=True, error=error,
                                         num_output_tokens=request.num_output_tokens))
        return results

    def abort(self, request_id: str) -> RequestOutput | None:
        """Ends a request now and frees its KV blocks; returns its last output."""
        request = self.scheduler.requests.get(request_id)
        if request is None:
            return None
        self.scheduler.finish_request(request_id, FinishReason.ABORT)
        return self._emit(request)

    def _emit(self, request: Request) -> RequestOutput | None:
        output = self.outputs.make_output(request)
        if request.is_finished:
            self.outputs.remove(request.request_id)
            self.scheduler.release(request.request_id)
            if self.draft is not None:
                self.draft.release([request.request_id])
        return output

    def stats(self) -> EngineStats:
        """The engine now, as data (the metrics' only source)."""
        scheduler, kv, spec = self.scheduler, self.kv_cache, self.scheduler.spec_stats
        disk = kv.store.stats() if kv.store is not None else (0, 0, 0, 0)
        return EngineStats(len(scheduler.running), len(scheduler.waiting), kv.usage(), kv.stats.num_queries, kv.stats.num_hits,
                           scheduler.stats.num_preemptions, spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens,
                           tuple(spec.accepted_per_position), *disk)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def check_invariants(self) -> None:
        """Pool invariants plus: every running request owns the blocks its computed tokens need."""
        self.kv_cache.check_invariants()
        for request in self.scheduler.running:
            blocks = self.kv_cache.req_to_blocks.get(request.request_id, [])
            assert len(blocks) * self.config.block_size >= request.num_computed_tokens, request.request_id
