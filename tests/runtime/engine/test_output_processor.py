"""The output processor alone: the three output kinds (cumulative, delta, final_only) carry the same
request, deltas joined equal the cumulative output, logprobs follow the kept tokens, and text held
back for a possible stop string is released when the request finishes."""

from __future__ import annotations

import pytest
from support.tiny_models import add_byte_tokenizer
from tokenizers import Tokenizer

from ortinf.runtime.core.request import FinishReason, Request, RequestStatus
from ortinf.runtime.core.stopping import judge
from ortinf.runtime.engine.output_processor import OutputProcessor
from ortinf.runtime.sample.request_options import RequestOptions
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.worker.scheduler_output import ModelRunnerOutput, TokenLogprobs

TEXT = "hello world, this is a test"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("bytes")
    add_byte_tokenizer(folder)
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def run(tokenizer: Tokenizer, kind: str, per_step: int = 2, **params):
    """Feeds TEXT's tokens `per_step` at a time as the engine does (judge, append, record, output)."""
    processor = OutputProcessor(tokenizer)
    sampling = SamplingParams(logprobs=0, max_tokens=100, **params)
    request = Request("r", [5, 6], sampling, eos_token_ids=(2,), options=RequestOptions(output_kind=kind))
    processor.add_request(request, "prompt")
    tokens = tokenizer.encode(TEXT, add_special_tokens=False).ids + [2]
    outputs = []
    for start in range(0, len(tokens), per_step):
        new = tokens[start : start + per_step]
        logprobs = {"r": [TokenLogprobs(t, -float(t), 1) for t in new]}
        verdict = judge(request, new, processor.detokenizer("r"), 4096)
        for token in new[: verdict.keep]:
            request.append_output_token(token)
        if verdict.finish_reason is not None:
            request.status, request.finish_reason, request.stop_reason = RequestStatus.FINISHED, verdict.finish_reason, verdict.stop_reason
        processor.record_step(request, ModelRunnerOutput(logprobs=logprobs), 1.0)
        output = processor.make_output(request)
        if output is not None:
            outputs.append(output)
        if request.is_finished:
            break
    return outputs, request


def test_cumulative_outputs_grow_and_the_last_is_the_whole_answer(tokenizer):
    outputs, request = run(tokenizer, "cumulative")
    texts = [o.outputs[0].text for o in outputs]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    final = outputs[-1].outputs[0]
    assert final.text == TEXT and final.finish_reason == "stop" and outputs[-1].finished
    assert final.token_ids == request.output_token_ids and [lp.token_id for lp in final.logprobs] == request.output_token_ids


def test_deltas_joined_equal_the_cumulative_output(tokenizer):
    deltas, _ = run(tokenizer, "delta")
    cumulative, _ = run(tokenizer, "cumulative")
    assert all(o.delta for o in deltas)
    joined = deltas[0]
    for later in deltas[1:]:
        joined = joined.followed_by(later)
    a, b = joined.outputs[0], cumulative[-1].outputs[0]
    assert (a.text, a.token_ids, a.logprobs, a.finish_reason) == (b.text, b.token_ids, b.logprobs, b.finish_reason)
    assert joined.num_output_tokens == cumulative[-1].num_output_tokens


def test_final_only_gives_one_output(tokenizer):
    outputs, _ = run(tokenizer, "final_only")
    assert len(outputs) == 1 and outputs[0].finished and outputs[0].outputs[0].text == TEXT


def test_a_stop_string_holds_back_text_then_ends_before_it(tokenizer):
    outputs, request = run(tokenizer, "delta", per_step=1, stop=("this is",))
    streamed = "".join(o.outputs[0].text for o in outputs)
    assert streamed == "hello world, " and request.finish_reason == FinishReason.STOP and request.stop_reason == "this is"
    assert all("this" not in o.outputs[0].text for o in outputs)
    # what was held back while "th" might have begun the stop string never went out early
    assert sum(len(o.outputs[0].token_ids) for o in outputs) == request.num_output_tokens
    logprobs = [lp for o in outputs for lp in o.outputs[0].logprobs]
    assert [lp.token_id for lp in logprobs] == request.output_token_ids
