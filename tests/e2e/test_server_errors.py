"""Every error row of the server: status and OpenAI error shape; configuration by env and YAML."""

from __future__ import annotations

import subprocess

import httpx
import pytest
from starlette.testclient import TestClient
from support.server_helpers import running_server

from ortinf.manifest import FORMAT_VERSION
from ortinf.serve.app import build_app
from ortinf.serve.state import ServerConfig


def assert_error(response: httpx.Response, status: int, *fragments: str, param: str | None = None) -> dict:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert len(error["message"]) <= 300
    for fragment in fragments:
        assert fragment in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({"prompt": "x", "temperature": -1}, "temperature", "greater than or equal to 0"),
        ({"prompt": "x", "temperature": "hot"}, "temperature", ""),
        ({"prompt": "x", "top_p": 0}, "top_p", ""),
        ({"prompt": "x", "top_p": 1.5}, "top_p", ""),
        ({"prompt": "x", "n": 0}, "n", ""),
        ({"prompt": "x", "n": 1000}, "n", ""),
        ({"prompt": "x", "max_tokens": "ten"}, "max_tokens", ""),
        ({"prompt": "x", "logprobs": 50}, "logprobs", ""),
        ({"prompt": "x", "top_k": -5}, "top_k", ""),
        ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty", "> 0"),  # one range check, SamplingParams'
        ({"prompt": "x", "min_tokens": -1}, "min_tokens", ""),
        ({"prompt": "x", "logit_bias": {"5": 500}}, "logit_bias", "[-100, 100]"),
        ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs", ""),
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": []}, "prompt", "empty"),
        ({"max_tokens": 3}, "prompt", "Field required"),
    ],
)
def test_bad_completion_requests_are_400(llama_server, body, param, fragment):
    assert_error(httpx.post(f"{llama_server.url}/v1/completions", json=body), 400, fragment, param=param)


def test_context_length_names_both_numbers(llama_server):
    response = httpx.post(f"{llama_server.url}/v1/completions", json={"prompt": [5] * 500, "max_tokens": 100})
    assert_error(response, 400, "500 tokens", "max_tokens (100)", "context length 512")


def test_non_finite_and_malformed_bodies(llama_server):
    url = f"{llama_server.url}/v1/completions"
    headers = {"content-type": "application/json"}
    assert_error(httpx.post(url, content='{"prompt": "x", "temperature": NaN}', headers=headers), 400)
    assert_error(httpx.post(url, content='{"prompt": "x", "temperature": 1e999}', headers=headers), 400, param="temperature")
    assert_error(httpx.post(url, content='{"prompt": "x",', headers=headers), 400, "not valid JSON")
    assert_error(httpx.post(url, content='["prompt"]', headers=headers), 400)
    assert_error(httpx.post(url, content="prompt=x"), 400)


def test_messages_never_echo_huge_inputs(llama_server):
    response = httpx.post(f"{llama_server.url}/v1/completions", json={"prompt": "x" * 200_000, "temperature": [1] * 1000})
    error = assert_error(response, 400, param="temperature")
    assert "xxxxxxxxxx" not in error["message"]


def test_unknown_model_is_404(llama_server):
    error = assert_error(httpx.post(f"{llama_server.url}/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404, "gpt-9", param="model")
    assert error["code"] == "model_not_found"
    assert_error(httpx.post(f"{llama_server.url}/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}), 404)


def test_chat_and_embedding_errors(llama_server):
    url = llama_server.url
    assert_error(httpx.post(f"{url}/v1/chat/completions", json={"messages": []}), 400, param="messages")
    assert_error(httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}), 400)
    assert_error(httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}), 400,
                 param="top_logprobs")
    assert_error(httpx.post(f"{url}/v1/embeddings", json={"input": "x"}), 400, "does not embed", param="model")


def test_health_is_503_until_loaded():
    app = build_app(ServerConfig(packages=()))  # lifespan not started: nothing loaded
    client = TestClient(app)
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["error"]["message"] == "the model is loading"
    assert client.get("/v1/models").status_code == 503


def test_api_key_body_limit_and_config_sources(chat_package, tmp_path):
    """YAML sets an API key, a body limit and a model name; the environment overrides the key and
    the command line overrides the name (CLI > env > YAML)."""
    config = tmp_path / "serve.yaml"
    config.write_text("api_key: yaml-key\nmax_body_size: 1KiB\nserved_model_names: [from-yaml]\nmax_num_seqs: 4\n")
    args = [str(chat_package), "--config", str(config), "--served-model-name", "from-cli"]
    with running_server(args, tmp_path, env={"ORTINF_API_KEY": "env-key"}) as server:
        url = server.url
        assert_error(httpx.get(f"{url}/v1/models"), 401, "API key")
        assert_error(httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer yaml-key"}), 401)
        models = httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer env-key"})
        assert [m["id"] for m in models.json()["data"]] == ["from-cli"]
        assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/metrics").status_code == 200
        big = {"model": "from-cli", "prompt": "x" * 2000}
        assert_error(httpx.post(f"{url}/v1/completions", json=big, headers={"authorization": "Bearer env-key"}), 413)
        ok = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers={"authorization": "Bearer env-key"})
        assert ok.status_code == 200


def test_serve_cli_errors(tmp_path):
    from test_cli_export import assert_user_error, ortinf

    assert_user_error(ortinf("serve", tmp_path / "missing"), "no such folder")
    (tmp_path / "bad.yaml").write_text("prot: 1\n")
    bad = ortinf("serve", tmp_path, "--config", tmp_path / "bad.yaml")
    assert bad.returncode == 2 and "unknown keys" in bad.stderr and "prot" in bad.stderr
    assert ortinf("serve", "--help").returncode == 0
    (tmp_path / "a" / "pkg").mkdir(parents=True)
    (tmp_path / "b" / "pkg").mkdir(parents=True)
    for folder in (tmp_path / "a" / "pkg", tmp_path / "b" / "pkg"):
        (folder / "ortinf.json").write_text('{"format_version": %d, "task": "text-generation", "architecture": "x", ' % FORMAT_VERSION +
                                            '"model_type": "llama", "dtype": "fp32", "inputs": [], "outputs": []}')
    same = ortinf("serve", tmp_path / "a" / "pkg", tmp_path / "b" / "pkg")
    assert same.returncode == 2 and "both be served as 'pkg'" in same.stderr


def test_fuzzing_the_openapi_schema_finds_no_500(llama_server, tmp_path):
    """schemathesis generates requests from the published schema: none may get a 500."""
    schemathesis = str(__import__("pathlib").Path(__import__("sys").executable).with_name("schemathesis"))
    result = subprocess.run(
        [schemathesis, "run", f"{llama_server.url}/openapi.json", "--checks", "not_a_server_error", "--max-examples", "25",
         "--seed", "1", "--request-timeout", "30", "--generation-database", "none"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,  # schemathesis writes a cache in its cwd
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert httpx.get(f"{llama_server.url}/health").status_code == 200


def test_missing_chat_template_and_version(decoder_package):
    """In-process app with its real lifespan: the package without a chat template refuses chat."""
    import time

    _, package = decoder_package("llama")  # exported without a chat template
    with TestClient(build_app(ServerConfig(packages=(package,)))) as client:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert_error(response, 400, "no chat template", param="messages")
        import ortinf

        assert client.get("/version").json() == {"version": ortinf.__version__}
