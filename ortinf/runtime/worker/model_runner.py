"""ModelRunner: runs one SchedulerOutput through the decoder graph and samples.

It sees only the scheduler's output (never Request objects): it builds ModelInput, runs the graph
(which writes the new K/V into the pool in place), samples, and computes logprobs where asked.

A step may run as several graph calls (ortinf/runtime/worker/call_planner.py): the portable kernel pads every
sequence to the longest query in the call, so one 256-token chunk would make 31 decodes cost 256
query rows each (benchmarks/decode_step.py: ~460 ms instead of ~70 ms), and prompts of very
different lengths are cheaper in separate calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ortinf.runtime.sample.decoder_rules import DecoderRules
from ortinf.runtime.sample.sampler import Sampler, log_softmax
from ortinf.runtime.sample.speculative import verify
from ortinf.runtime.sample.structured_output import GrammarCompiler
from ortinf.runtime.sample.whisper_rules import SpeechRules
from ortinf.runtime.worker.call_planner import plan_calls
from ortinf.runtime.worker.cross_encoder import CrossEncoder
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.encoder_input import covered
from ortinf.runtime.worker.image_spans import attend_until
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input
from ortinf.runtime.worker.mrope import rope_deltas
from ortinf.runtime.worker.scheduler_output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput, TokenLogprobs, top_logprobs
from ortinf.runtime.worker.vision_encoder import VisionEncoder


class ModelRunner:
    """Executes steps on a DecoderGraph; keeps one RNG per seeded request."""

    def __init__(self, graph: DecoderGraph, seed: int | None = None, grammars: GrammarCompiler | None = None,
                 encoder: CrossEncoder | None = None, rules: DecoderRules | None = None, vision: VisionEncoder | None = None,
                 speech_rules: SpeechRules | None = None) -> None:
        self.graph = graph
        self.vision = vision  # a vision-language package's: the image embeddings of the positions a step covers
        self.encoder = encoder  # an encoder-decoder's: runs first for the requests whose cross blocks wait for it
        self.rules = rules  # a Marian or BART package's generation rules (suppressed and forced tokens), every request's
        self.speech_rules = speech_rules  # a Whisper package's, for the requests whose options ask for them
        self.sampler = Sampler()
        self.shared_generator = np.random.default_rng(seed)
        self.grammars = grammars
        self.matchers: dict = {}  # request id -> its llguidance matcher (structured output)
        self.allowed_ids: dict[str, np.ndarray] = {}  # request id -> its allowed_token_ids as a mask, built once
        self._mask_worker = ThreadPoolExecutor(1, thread_name_prefix="ortinf-masks") if grammars else None
        self._advanced_matchers: list = []  # matchers this call advanced (rolled back if the call fails after)

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in scheduler_output.finished_request_ids:
            self.matchers.pop(request_id, None)
            self.allowed_ids.pop(request_id, None)
        if self.vision is not None:  # the scheduler's encoder cache decides what is held (ortinf/runtime/core/encoder_cache.py)
            self.vision.free(scheduler_output.free_image_digests)
        scheduled = scheduler_output.scheduled
        if not scheduled:
            return ModelRunnerOutput()
        sampling = [i for i, s in enumerate(scheduled) if s.sample and not s.spec_token_ids]
        speculated = [i for i, s in enumerate(scheduled) if s.sample and s.spec_token_ids]
        masks = self._start_masks([scheduled[i] for i in sampling])  # filled while the graph runs
        last_rows: list[np.ndarray | None] = [None] * len(scheduled)
        prompt_rows: dict[int, np.ndarray] = {}
        query_lens = [len(s.token_ids) for s in scheduled]
        to_encode = [(s.encoder_input, s.cross_block_ids) for s in scheduled if s.encoder_input is not None]
        if to_encode:
            self.encoder.encode(to_encode, self.graph.block_size)
        if self.vision is not None and scheduler_output.encode_images:  # in batched calls; of those this run's chunks cover
            # (all but when the engine re-runs a step one by one)
            needed = {p.image.digest for s in scheduled for p in covered(s.images, s.num_computed_tokens, s.num_computed_tokens + len(s.token_ids))}
            self.vision.prepare([p for p in scheduler_output.encode_images if p.image.digest in needed])
        try:
            for group in plan_calls(query_lens, [s.num_computed_tokens for s in scheduled], self.graph.block_size):
                self._run_group(scheduled, group, last_rows, prompt_rows)
        finally:
            grammar_masks = masks.result() if masks is not None else None  # never leave a matcher in use by the worker

        output = ModelRunnerOutput()
        # Sampling advances state that outlives the call (random generators, grammar matchers). If
        # anything after it fails, that state is put back, so that the engine's one-by-one re-run of
        # the step (engine.py) samples exactly what a step without the failure would have.
        generators = {id(g): g for g in (self._generator(scheduled[i]) for i in (*sampling, *speculated))}
        states = [(g, g.bit_generator.state) for g in generators.values()]
        self._advanced_matchers = []
        try:
            if sampling:
                self._sample([scheduled[i] for i in sampling], np.stack([last_rows[i][-1] for i in sampling]), output, grammar_masks)
            for i in speculated:
                self._verify(scheduled[i], last_rows[i], output)
            for index, rows in prompt_rows.items():
                output.prompt_logprobs[scheduled[index].request_id] = (scheduled[index].num_computed_tokens + 1,
                                                                       prompt_logprobs(scheduled[index], rows))
        except BaseException:
            for generator, state in states:
                generator.bit_generator.state = state
            for matcher in self._advanced_matchers:
                matcher.rollback(1)
            raise
        return output

    def _run_group(self, scheduled: Sequence[ScheduledRequest], group: list[int], last_rows: list, prompt_rows: dict[int, np.ndarray]) -> None:
        chunks = [SequenceChunk(scheduled[i].token_ids, scheduled[i].num_computed_tokens, scheduled[i].block_ids, scheduled[i].lora_slot,
                                scheduled[i].cross_block_ids, scheduled[i].cross_len, *self._images(scheduled[i]),
                                self._rope_deltas(scheduled[i]), self._attend_until(scheduled[i])) for i in group]
        all_logits = [scheduled[i].wants_prompt_logprobs or bool(scheduled[i].spec_token_ids) for i in group]
        logits = self.graph.run(build_model_input(chunks, self.graph.block_size, all_logits))
        row = 0
        for index, full in zip(group, all_logits):
            count = len(scheduled[index].token_ids) if full else 1
            if scheduled[index].wants_prompt_logprobs:
                prompt_rows[index] = logits[row : row + count]
            verified = len(scheduled[index].spec_token_ids) + 1  # the rows of the last real token and of each proposal
            last_rows[index] = logits[row + count - verified : row + count]
            row += count

    def _images(self, scheduled: ScheduledRequest) -> tuple[np.ndarray | None, np.ndarray | None]:
        """A vision-language graph's image embeddings and rows for this chunk (empty when it covers none)."""
        if self.vision is None:
            return None, None
        start = scheduled.num_computed_tokens
        return self.vision.chunk(scheduled.images, start, start + len(scheduled.token_ids) - len(scheduled.spec_token_ids))

    def _rope_deltas(self, scheduled: ScheduledRequest) -> np.ndarray | None:
        """An M-RoPE graph's position offsets for a chunk of a request with images (None: zeros, as text)."""
        if not scheduled.images or not self.graph.spec.mrope_section:
            return None
        start = scheduled.num_computed_tokens
        return rope_deltas(scheduled.images, start, start + len(scheduled.token_ids))

    def _attend_until(self, scheduled: ScheduledRequest) -> np.ndarray | None:
        """An image-span graph's last visible position per token of a chunk with whole images (None: causal)."""
        if not any(p.whole for p in scheduled.images):
            return None
        start = scheduled.num_computed_tokens
        return attend_until(scheduled.images, start, start + len(scheduled.token_ids))

    def _start_masks(self, requests: list[ScheduledRequest]) -> Future | None:
        """Starts filling the grammar masks of the constrained rows: {row: allowed-token mask}."""
        rows = [row for row, s in enumerate(requests) if s.sampling_params.structured_output is not None]
        if not rows or self.grammars is None or self._mask_worker is None:
            return None
        matchers = [self._matcher(requests[row]) for row in rows]
        return self._mask_worker.submit(lambda: dict(zip(rows, self.grammars.fill_masks(matchers))))

    def _matcher(self, scheduled: ScheduledRequest):
        if scheduled.request_id not in self.matchers:
            self.matchers[scheduled.request_id] = self.grammars.matcher(scheduled.sampling_params.structured_output)
        return self.matchers[scheduled.request_id]

    def _sample(self, requests: list[ScheduledRequest], logits: np.ndarray, output: ModelRunnerOutput,
                grammar_masks: dict[int, np.ndarray] | None) -> None:
        params = [s.sampling_params for s in requests]
        for row, s in enumerate(requests):
            if s.options.watch_token_ids:
                ids = [t for t in s.options.watch_token_ids if 0 <= t < logits.shape[-1]]
                row_logprobs = log_softmax(np.asarray(logits[row : row + 1], dtype=np.float32))[0]
                output.watched[s.request_id] = {t: float(row_logprobs[t]) for t in ids}
        logits = self._processed(requests, logits)
        histories = [
            (s.all_token_ids[: s.num_prompt_tokens], s.all_token_ids[s.num_prompt_tokens :]) if s.sampling_params.has_penalties else ((), ())
            for s in requests
        ]
        generators = [self._generator(s) for s in requests]
        banned = [self._banned(s) for s in requests]
        allowed = [self._allowed(s, (grammar_masks or {}).get(row), banned[row]) for row, s in enumerate(requests)]
        for row, s in enumerate(requests):
            if allowed[row] is not None and not allowed[row].any():
                output.cannot_continue[s.request_id] = "no token is allowed next (the requested format, allowed_token_ids and bans exclude all)"
                allowed[row] = None  # sampled anyway (all -inf would be NaN), then dropped
        tokens, logprobs = self.sampler(logits, params, histories, generators, banned, allowed)
        for row, s in enumerate(requests):
            if s.options.top_candidates and s.request_id not in output.cannot_continue:
                forced = self.rules.forced(s.num_output_tokens, s.sampling_params.max_tokens) if self.rules else None
                output.candidates[s.request_id] = ([(forced, 0.0)] if forced is not None else  # transformers scores a forced token 0
                                                   top_candidates(logits[row], banned[row], allowed[row], s.options.top_candidates))
        constrained: list[tuple[str, int]] = []
        for row, (s, token) in enumerate(zip(requests, tokens.tolist())):
            if s.request_id in output.cannot_continue:
                continue
            output.sampled_token_ids[s.request_id] = [token]
            if s.sampling_params.logprobs is not None:
                assert logprobs is not None
                output.logprobs[s.request_id] = [top_logprobs(logprobs[row], token, s.sampling_params.logprobs)]
            if s.request_id in self.matchers:
                constrained.append((s.request_id, token))
        if constrained and self.grammars is not None:  # every matcher advances on its accepted token, in parallel
            outcomes = self.grammars.advance([(self.matchers[rid], token) for rid, token in constrained])
            for (rid, _), (complete, error) in zip(constrained, outcomes):
                if error is None:
                    self._advanced_matchers.append(self.matchers[rid])
                if error is not None:
                    output.cannot_continue[rid] = error
                elif complete:
                    output.format_complete.add(rid)

    def _processed(self, requests: list[ScheduledRequest], logits: np.ndarray) -> np.ndarray:
        """The rows of the requests that ask for the package's Whisper rules (RequestOptions.whisper_timestamps)
        after them, in a copy: their logprobs are of the processed rows, as transformers' scores are."""
        rows = [(row, s.all_token_ids[s.num_prompt_tokens :], s.options.whisper_timestamps) for row, s in enumerate(requests)
                if s.options.whisper_timestamps is not None]
        if not rows or self.speech_rules is None:  # LLMEngine.add_request refuses them on other packages
            return logits
        return self.speech_rules.apply(logits, rows)

    def _verify(self, scheduled: ScheduledRequest, rows: np.ndarray, output: ModelRunnerOutput) -> None:
        """Replaces the request's one sampled token by the proposals its logits accept plus one
        (ortinf/runtime/sample/speculative.py); only requests that can_speculate get here."""
        params = scheduled.sampling_params
        count = len(rows)
        allowed = self._allowed(scheduled, None, ())
        processed = self.sampler.process(rows, [params] * count, [((), ())] * count, (), [allowed] * count)
        tokens = verify(processed, list(scheduled.spec_token_ids), params.greedy,
                        lambda i: self.sampler.draw_row(processed[i], params, self._generator(scheduled, i).random()))
        output.sampled_token_ids[scheduled.request_id] = tokens
        if params.logprobs is not None:
            logprobs = log_softmax(rows.astype(np.float32))
            output.logprobs[scheduled.request_id] = [top_logprobs(logprobs[i], t, params.logprobs) for i, t in enumerate(tokens)]

    def _allowed(self, scheduled: ScheduledRequest, grammar_mask: np.ndarray | None, banned: Sequence[int]) -> np.ndarray | None:
        """The tokens this row may sample (grammar and allowed_token_ids, less the bans), or None for all."""
        allowed_ids = scheduled.sampling_params.allowed_token_ids
        vocab = self.graph.spec.vocab_size
        forced = self.rules.forced(scheduled.num_output_tokens, scheduled.sampling_params.max_tokens) if self.rules else None
        if forced is not None:  # transformers' forced BOS/EOS: over every other rule
            mask = np.zeros(vocab, dtype=bool)
            mask[forced] = True
            return mask
        if grammar_mask is None and allowed_ids is None:
            return None
        mask = grammar_mask.copy() if grammar_mask is not None else np.ones(vocab, dtype=bool)
        if allowed_ids is not None:
            only = self.allowed_ids.get(scheduled.request_id)
            if only is None:
                only = self.allowed_ids[scheduled.request_id] = np.zeros(vocab, dtype=bool)
                only[[t for t in allowed_ids if t < vocab]] = True
            mask &= only
        mask[[t for t in banned if 0 <= t < vocab]] = False
        return mask

    def _banned(self, scheduled: ScheduledRequest) -> tuple[int, ...]:
        """EOS and stop token ids may not be sampled before min_tokens (vLLM's semantics); nor may the
        last token of a bad word whose other tokens end the output."""
        params = scheduled.sampling_params
        banned: tuple[int, ...] = ()
        if self.rules is not None:
            if self.rules.forced(scheduled.num_output_tokens, params.max_tokens) is not None:
                return ()  # the forced token comes whatever else bans it (_allowed)
            banned = self.rules.banned(scheduled.num_output_tokens)
        if scheduled.num_output_tokens < params.min_tokens:
            eos = () if params.ignore_eos else self.graph.manifest.eos_token_ids
            banned += (*eos, *params.stop_token_ids)
        if scheduled.options.bad_words_ids:
            output_ids = scheduled.all_token_ids[scheduled.num_prompt_tokens :]
            for word in scheduled.options.bad_words_ids:
                prefix = list(word[:-1])
                if len(output_ids) >= len(prefix) and list(output_ids[len(output_ids) - len(prefix):]) == prefix:
                    banned += (word[-1],)
        return banned

    def _generator(self, scheduled: ScheduledRequest, offset: int = 0) -> np.random.Generator:
        """The random stream of the request's next sampled token (`offset` more for a speculated position):
        a seeded request's token at output position p draws from its own stream (seed, p), so its tokens
        depend neither on the batch, nor on whether a step speculated, nor on preemption; the others share
        the runner's generator."""
        seed = scheduled.sampling_params.seed
        if seed is None:
            return self.shared_generator
        return np.random.default_rng([seed, scheduled.num_output_tokens + offset])


def top_candidates(row: np.ndarray, banned: Sequence[int], allowed: np.ndarray | None, k: int) -> list[tuple[int, float]]:
    """The k best (token, log-probability) of a row, best first, as transformers' beam search scores them:
    the log-softmax of the logits, then the rules' masks (bans, forced and allowed tokens) at -inf, not
    renormalised; -inf tokens are left out."""
    logprobs = log_softmax(np.asarray(row, dtype=np.float32)[None, :])[0]
    vocab = len(logprobs)
    if allowed is not None:
        logprobs[~allowed] = -np.inf
    ids = [t for t in banned if 0 <= t < vocab]
    if ids:
        logprobs[ids] = -np.inf
    k = min(k, vocab)
    top = np.argpartition(-logprobs, k - 1)[:k]
    top = top[np.argsort(-logprobs[top], kind="stable")]
    return [(int(t), float(logprobs[t])) for t in top if np.isfinite(logprobs[t])]


def prompt_logprobs(scheduled: ScheduledRequest, rows: np.ndarray) -> list[TokenLogprobs]:
    """Logprobs of the prompt tokens this chunk predicts (row j at position p predicts token p + 1)."""
    logprobs = log_softmax(rows.astype(np.float32))
    k = scheduled.sampling_params.prompt_logprobs or 0
    start = scheduled.num_computed_tokens
    end = min(start + len(rows), scheduled.num_prompt_tokens - 1)
    return [top_logprobs(logprobs[pos - start], scheduled.all_token_ids[pos + 1], k) for pos in range(start, end)]
