"""`ortinf serve --speculative-config`: the server's greedy output equals decoding without speculation,
and /metrics reports vLLM's spec_decode counters."""

from __future__ import annotations

import httpx
import openai
from support.server_helpers import metric, running_server

import ortinf
from ortinf.runtime.sample.sampling_params import SamplingParams

PROMPTS = ["the quick brown fox the quick brown fox the", "paged attention keeps keys and values; paged attention keeps", "12, 345 and 6789"]


def test_served_greedy_output_equals_plain_decoding(chat_package, tmp_path):
    plain = ortinf.LLM(chat_package).generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0))
    config = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
    with running_server([str(chat_package), "--speculative-config", config], tmp_path) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        served = client.completions.create(model="tiny-llama", prompt=PROMPTS, max_tokens=40, temperature=0)
        streamed = "".join(c.choices[0].text for c in client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=40,
                                                                                temperature=0, stream=True))
        text = httpx.get(f"{server.url}/metrics").text
    assert [c.text for c in sorted(served.choices, key=lambda c: c.index)] == [o.outputs[0].text for o in plain]
    assert streamed == plain[0].outputs[0].text
    drafts = metric(text, "ortinf:spec_decode_num_draft_tokens_total")
    accepted = metric(text, "ortinf:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and 0 <= accepted <= drafts
    assert metric(text, "ortinf:spec_decode_num_accepted_tokens_per_pos_total") == accepted
