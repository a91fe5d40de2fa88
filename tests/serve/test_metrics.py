"""ortinf/serve/metrics.py reads only EngineStats and RequestOutputs: counters per model advance by the growth
of each engine's own running totals, gauges follow the latest step, tokens and finishes are counted once."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from ortinf.runtime.engine.outputs import CompletionOutput, EngineStats, RequestMetrics, RequestOutput
from ortinf.serve.metrics import EngineMetrics


def samples(metrics: EngineMetrics) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(metrics: EngineMetrics, name: str, **labels) -> float:
    return samples(metrics).get((name, tuple(sorted(labels.items()))), 0.0)


def output(request_id: str, num_tokens: int, finish: str | None = None, latencies: tuple[float, ...] = ()) -> RequestOutput:
    """`latencies`: the request's inter-token latencies so far (its record, which the engine keeps growing)."""
    completion = CompletionOutput(0, "x", [7], finish_reason=finish)
    metrics = RequestMetrics(arrival_time=0.0, first_scheduled_time=0.1, first_token_time=0.2, finished_time=0.3 if finish else None,
                             inter_token_latencies=list(latencies))
    return RequestOutput(request_id, None, [1, 2, 3], [completion], finished=finish is not None, metrics=metrics,
                         num_output_tokens=num_tokens, delta=True)


def test_two_models_count_their_own_totals():
    metrics = EngineMetrics()
    metrics.observe_step("a", EngineStats(num_running=2, prefix_cache_queries=100, prefix_cache_hits=40, num_preemptions=1), [])
    metrics.observe_step("b", EngineStats(num_running=5, prefix_cache_queries=10), [])
    metrics.observe_step("a", EngineStats(num_running=1, prefix_cache_queries=130, prefix_cache_hits=40, num_preemptions=3), [])
    assert value(metrics, "ortinf:prefix_cache_queries_total", model_name="a") == 130
    assert value(metrics, "ortinf:prefix_cache_queries_total", model_name="b") == 10
    assert value(metrics, "ortinf:num_preemptions_total", model_name="a") == 3
    assert value(metrics, "ortinf:num_preemptions_total", model_name="b") == 0  # exported at 0 from its first step
    assert value(metrics, "ortinf:num_requests_running", model_name="a") == 1
    assert value(metrics, "ortinf:num_requests_running", model_name="b") == 5


def test_speculative_counters_per_position():
    metrics = EngineMetrics()
    metrics.observe_step("a", EngineStats(spec_num_drafts=1, spec_num_draft_tokens=3, spec_num_accepted_tokens=2,
                                          spec_accepted_per_position=(1, 1, 0)), [])
    metrics.observe_step("a", EngineStats(spec_num_drafts=2, spec_num_draft_tokens=6, spec_num_accepted_tokens=3,
                                          spec_accepted_per_position=(2, 1, 0)), [])
    assert value(metrics, "ortinf:spec_decode_num_draft_tokens_total", model_name="a") == 6
    assert value(metrics, "ortinf:spec_decode_num_accepted_tokens_per_pos_total", model_name="a", position="0") == 2
    assert value(metrics, "ortinf:spec_decode_num_accepted_tokens_per_pos_total", model_name="a", position="1") == 1


def test_tokens_and_finishes_are_counted_once_per_request():
    metrics = EngineMetrics()
    metrics.observe_step("a", EngineStats(), [output("r", 1)])
    metrics.observe_step("a", EngineStats(), [output("r", 4, latencies=(0.05,))])
    metrics.observe_step("a", EngineStats(), [output("r", 6, finish="length", latencies=(0.05, 0.07))])
    metrics.observe_step("a", EngineStats(), [output("f", 5, finish="stop", latencies=(0.01, 0.02, 0.03, 0.04))])  # final_only: one output
    assert value(metrics, "ortinf:generation_tokens_total", model_name="a") == 11
    assert value(metrics, "ortinf:prompt_tokens_total", model_name="a") == 6
    assert value(metrics, "ortinf:request_success_total", model_name="a", finished_reason="length") == 1
    assert value(metrics, "ortinf:time_to_first_token_seconds_count", model_name="a") == 2
    assert value(metrics, "ortinf:inter_token_latency_seconds_count", model_name="a") == 6  # a final_only request's four too
