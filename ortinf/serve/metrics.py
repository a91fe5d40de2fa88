"""Prometheus metrics with vLLM's names under an `ortinf:` prefix (or `vllm:` with
`--metrics-prefix vllm`), so vLLM dashboards and cluster routers map 1:1.

Updated from the engine thread after every step; each server has its own registry (no global state).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ortinf.runtime.engine.outputs import EngineStats, RequestOutput

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


@dataclass(slots=True)
class _Live:
    num_tokens: int = 0
    num_latencies: int = 0  # of its inter-token latencies, those observed already


class EngineMetrics:
    """The metrics of one server; `observe_step` is the AsyncEngine's on_step hook."""

    def __init__(self, prefix: str = "ortinf") -> None:
        """`prefix` names every metric (`ortinf:num_requests_waiting`); "vllm" gives the names that vLLM
        dashboards, autoscalers and the Gateway API Inference Extension's endpoint picker read."""
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge(f"{prefix}:num_requests_running", "Requests in the running batch.", labels, registry=r)
        self.waiting = Gauge(f"{prefix}:num_requests_waiting", "Requests waiting to be scheduled.", labels, registry=r)
        self.kv_usage = Gauge(f"{prefix}:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", labels, registry=r)
        self.prefix_queries = Counter(f"{prefix}:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", labels, registry=r)
        self.prefix_hits = Counter(f"{prefix}:prefix_cache_hits", "Prompt tokens found in the prefix cache.", labels, registry=r)
        self.preemptions = Counter(f"{prefix}:num_preemptions", "Requests preempted for lack of KV blocks.", labels, registry=r)
        self.prompt_tokens = Counter(f"{prefix}:prompt_tokens", "Prompt tokens processed.", labels, registry=r)
        self.generation_tokens = Counter(f"{prefix}:generation_tokens", "Tokens generated.", labels, registry=r)
        self.success = Counter(f"{prefix}:request_success", "Finished requests.", [*labels, "finished_reason"], registry=r)
        self.ttft = Histogram(f"{prefix}:time_to_first_token_seconds", "Time to first token.", labels, buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(f"{prefix}:inter_token_latency_seconds", "Time between output tokens.", labels, buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(f"{prefix}:e2e_request_latency_seconds", "Request latency, arrival to finish.", labels,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram(f"{prefix}:request_queue_time_seconds", "Time waiting before first scheduled.", labels,
                               buckets=LATENCY_BUCKETS, registry=r)
        self.models_loaded = Gauge(f"{prefix}:models_loaded", "--models-dir models loaded now.", registry=r)
        self.model_loaded_flag = Gauge(f"{prefix}:model_loaded", "1 while a --models-dir model is loaded, 0 once it unloaded.", labels,
                                       registry=r)
        self.model_loads = Counter(f"{prefix}:model_loads", "--models-dir models loaded (on a request).", labels, registry=r)
        self.admitted = Gauge(f"{prefix}:num_requests_admitted", "Sequences admitted by the server (running, queued, or "
                              "being tokenised); past --max-num-seqs + --max-queued-requests requests get 429.", registry=r)
        self.spec_drafts = Counter(f"{prefix}:spec_decode_num_drafts", "Steps in which a request verified proposals.", labels, registry=r)
        self.spec_draft_tokens = Counter(f"{prefix}:spec_decode_num_draft_tokens", "Proposed (speculative) tokens.", labels, registry=r)
        self.spec_accepted = Counter(f"{prefix}:spec_decode_num_accepted_tokens", "Proposed tokens accepted.", labels, registry=r)
        self.audio_seconds = Counter(f"{prefix}:audio_seconds", "Seconds of audio transcribed or translated.", labels, registry=r)
        self.windows = Counter(f"{prefix}:transcription_windows", "30-second windows decoded: kept, retried at a higher "
                               "temperature, or skipped as silence.", [*labels, "outcome"], registry=r)
        self.encoder_hits = Counter(f"{prefix}:encoder_cache_hits", "Windows whose encoder output was found in the pool "
                                    "(the same audio again).", labels, registry=r)
        self.spec_per_pos = Counter(f"{prefix}:spec_decode_num_accepted_tokens_per_pos", "Proposed tokens accepted, by position.",
                                    [*labels, "position"], registry=r)
        disk = "--prefix-cache-dir blocks"
        self.disk_restored = Counter(f"{prefix}:prefix_cache_disk_blocks_restored", f"{disk} read from the folder.", labels, registry=r)
        self.disk_written = Counter(f"{prefix}:prefix_cache_disk_blocks_written", f"{disk} written to the folder.", labels, registry=r)
        self.disk_evicted = Counter(f"{prefix}:prefix_cache_disk_blocks_evicted", f"{disk} removed to keep the folder within "
                                    "--prefix-cache-disk (any package's).", labels, registry=r)
        self.disk_bytes = Gauge(f"{prefix}:prefix_cache_disk_bytes", "Bytes of the --prefix-cache-dir folder's blocks (every "
                                "package's, as this server knows them).", labels, registry=r)
        self._disk_models: set[str] = set()
        self._live: dict[str, _Live] = {}
        self._seen: dict[str, EngineStats] = {}  # per model: the engine's running totals counted so far
        self._seen_speech: dict[str, dict[str, float]] = {}  # per speech model: the transcriber's totals counted so far

    def model_loaded(self, name: str, loaded: bool) -> None:
        """A --models-dir model loaded or unloaded (ortinf/serve/model_manager.py)."""
        self.model_loaded_flag.labels(name).set(1 if loaded else 0)
        if loaded:
            self.model_loads.labels(name).inc()

    def hook(self, model_name: str):
        """The on_step callback for the engine serving `model_name`."""
        return lambda stats, outputs: self.observe_step(model_name, stats, outputs)

    def observe_step(self, model: str, stats: EngineStats, outputs: list[RequestOutput]) -> None:
        """One engine step: its outputs (tokens, latencies, finishes) and the engine's stats after it
        (gauges set, counters advanced by the running totals' growth since the model's last step)."""
        now = time.monotonic()
        for output in outputs:
            self._observe_output(model, output, now)
        self.running.labels(model).set(stats.num_running)
        self.waiting.labels(model).set(stats.num_waiting)
        self.kv_usage.labels(model).set(stats.kv_cache_usage)
        if stats.prefix_disk_bytes or model in self._disk_models:  # a model with --prefix-cache-dir: from its first block on
            self._disk_models.add(model)
            self.disk_bytes.labels(model).set(stats.prefix_disk_bytes)
        seen = self._seen.get(model, EngineStats())
        for counter, field in ((self.prefix_queries, "prefix_cache_queries"), (self.prefix_hits, "prefix_cache_hits"),
                               (self.preemptions, "num_preemptions"), (self.spec_drafts, "spec_num_drafts"),
                               (self.spec_draft_tokens, "spec_num_draft_tokens"), (self.spec_accepted, "spec_num_accepted_tokens"),
                               (self.disk_restored, "prefix_disk_restored"), (self.disk_written, "prefix_disk_written"),
                               (self.disk_evicted, "prefix_disk_evicted")):
            child = counter.labels(model)  # exported from the first step on, at 0
            grown = getattr(stats, field) - getattr(seen, field)
            if grown > 0:
                child.inc(grown)
        for position, count in enumerate(stats.spec_accepted_per_position):
            before = seen.spec_accepted_per_position[position] if position < len(seen.spec_accepted_per_position) else 0
            if count > before:
                self.spec_per_pos.labels(model, str(position)).inc(count - before)
        self._seen[model] = stats

    def _observe_output(self, model: str, output: RequestOutput, now: float) -> None:
        if output.pooled is not None or not output.outputs and output.error is None:  # an encoder input: no tokens, no finish reason
            return
        live = self._live.setdefault(f"{model}\0{output.request_id}", _Live())
        num_tokens = output.num_output_tokens  # the running total, whether the output is a delta or not
        metrics = output.metrics
        if num_tokens > live.num_tokens:
            self.generation_tokens.labels(model).inc(num_tokens - live.num_tokens)
            if live.num_tokens == 0 and metrics is not None:
                self.prompt_tokens.labels(model).inc(len(output.prompt_token_ids))
                self.ttft.labels(model).observe((metrics.first_token_time or now) - metrics.arrival_time)
                if metrics.first_scheduled_time is not None:
                    self.queue.labels(model).observe(metrics.first_scheduled_time - metrics.arrival_time)
            live.num_tokens = num_tokens
        if metrics is not None:  # from the request's own record: a final_only output brings them all at once
            for latency in metrics.inter_token_latencies[live.num_latencies :]:
                self.itl.labels(model).observe(latency)
            live.num_latencies = len(metrics.inter_token_latencies)
        if output.finished:
            self._live.pop(f"{model}\0{output.request_id}", None)
            reason = "error" if output.error is not None or not output.outputs else output.outputs[0].finish_reason or "abort"
            self.success.labels(model, reason).inc()
            if metrics is not None:
                self.e2e.labels(model).observe((metrics.finished_time or now) - metrics.arrival_time)

    def observe_transcription(self, model: str, seconds: float, audio_seconds: float, error: bool,
                              stats: dict[str, float] | None = None) -> None:
        """One speech-recognition request: its end (error or stop), latency, and the audio it covered;
        `stats`, the transcriber's (Transcriber.stats), advances its counters and sets its pool gauge."""
        self.observe_request(model, seconds, error)
        if not error:
            self.audio_seconds.labels(model).inc(audio_seconds)
        if stats is None:
            return
        seen = self._seen_speech.get(model, {})
        counters = [(self.windows.labels(model, o), o) for o in ("kept", "retried", "skipped")]
        counters += [(self.preemptions.labels(model), "preemptions"), (self.encoder_hits.labels(model), "encoder_cache_hits")]
        for child, field in counters:
            grown = stats[field] - seen.get(field, 0)
            if grown > 0:
                child.inc(grown)
        self.kv_usage.labels(model).set(stats["kv_cache_usage"])
        self._seen_speech[model] = stats

    def observe_request(self, model: str, seconds: float, error: bool) -> None:
        """A request that is not the text engine's (speech, text2text): its end and latency."""
        self.success.labels(model, "error" if error else "stop").inc()
        self.e2e.labels(model).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
