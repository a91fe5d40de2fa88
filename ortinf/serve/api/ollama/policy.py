"""What the Ollama routes do with each request field (ortinf/serve/policy_rules.py: the kinds; ortinf/serve/field_policy.py applies them)."""

from __future__ import annotations

from ortinf.serve.policy_rules import Rule, ignored, implemented, refused

_OLLAMA = {  # what /api/chat and /api/generate share (ortinf/serve/api/ollama/routes.py)
    "model": implemented("the served name (a trailing :latest is accepted)"),
    "stream": implemented("NDJSON lines, the last with done true; default true, as Ollama's"),
    "format": implemented("\"json\" (any JSON object) or a JSON schema: enforced by a grammar"),
    "options": implemented("temperature, top_p, top_k, min_p, seed, num_predict (stops at the context's end, done_reason "
                           "length, as Ollama), stop, repeat_penalty, presence_penalty, frequency_penalty, cache_salt; the "
                           "runner's (num_ctx, num_gpu, num_thread, ...) are named as ignored (options.NAME): the server's "
                           "options set them"),
    "think": implemented("true/false: the chat template's enable_thinking; low/medium/high also its reasoning_effort; thinking "
                         "comes from --reasoning-parser"),
    "keep_alive": implemented("with --models-dir: how long the model stays loaded once idle after this request (seconds or "
                              "5m/1h30m; negative or longer than Go's longest duration (~292 years): stays; 0: unloads at "
                              "once; NaN or infinite: a 400); without it every model stays loaded"),
    "logprobs": implemented("each line's tokens with their logprob and bytes, as Ollama's logprobs list"),
    "top_logprobs": implemented("0 to 20 alternatives per token, with logprobs true"),
    "cache_salt": implemented("vLLM's (also as options.cache_salt): prefix-cache blocks are shared only between requests with "
                              "the same salt"),
}
POLICY: dict[str, dict[str, Rule]] = {}
POLICY["/api/chat"] = {
    **_OLLAMA,
    "messages": implemented("system, user, assistant (with tool_calls), tool (tool_name); images as base64 on vision models; "
                            "none: the model's load answer (done_reason load)"),
    "tools": implemented("function tools; the model's calls are read by the tool-call parser"),
}
POLICY["/api/generate"] = {
    **_OLLAMA,
    "prompt": implemented("rendered as a user turn through the chat template, or as it is with raw (or without a template); "
                          "empty: the model's load answer (done_reason load)"),
    "system": implemented("a system turn before the prompt"),
    "images": implemented("base64 images on vision models"),
    "raw": implemented("the prompt as it is, no template"),
    "context": ignored("Ollama's deprecated token context: send the conversation to /api/chat"),
    "suffix": refused("no fill-in-the-middle: put the text in the prompt"),
    "template": refused("the package's chat template renders prompts: send raw: true with the prompt formatted"),
    "width": refused("no image generation"),
    "height": refused("no image generation"),
    "steps": refused("no image generation"),
}
POLICY["/api/embed"] = {
    "model": implemented("the served embedding model"),
    "input": implemented("a string or a list of strings"),
    "truncate": implemented("default true: inputs past the context length are cut; false: they are a 400"),
    "dimensions": implemented("the first k dimensions, re-normalised when the model normalises"),
    "options": ignored("embeddings take no sampling options"),
    "keep_alive": implemented("as on /api/chat"),
}
POLICY["/api/embeddings"] = {
    "model": implemented("the served embedding model"),
    "prompt": implemented("one text"),
    "options": ignored("embeddings take no sampling options"),
    "keep_alive": implemented("as on /api/chat"),
}
POLICY["/api/show"] = {
    "model": implemented("the served name"),
    "name": implemented("the older spelling of model"),
    "verbose": ignored("model_info holds what there is"),
}
