"""A vision-language package behind the real server, with the official openai client: chat messages with
OpenAI's image_url parts (base64 data URLs) answer as LLM.generate does on the same prompt and image, streamed
or not, usage counting the image's tokens; bad images, remote URLs and images sent to a text model are 400s
that name the problem, and the server goes on serving."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
from support.server_helpers import running_server
from support.tiny_models import add_special_tokens, build_llava

import ortinf
from ortinf import LLM, SamplingParams

Image = pytest.importorskip("PIL.Image")
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def llava_package(tmp_path_factory):
    root = tmp_path_factory.mktemp("llava-server")
    build_llava(root / "hf", add_special_tokens(root / "hf", 290, ["<image>"], TEMPLATE)["<image>"])
    ortinf.export(root / "hf", root / "pkg", progress=False)
    return root / "pkg"


QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def qwen_package(tmp_path_factory):
    """A tiny Qwen2.5-VL whose tokenizer has Qwen's vision tokens as special tokens."""
    from support.tiny_models import build_qwen_vl

    root = tmp_path_factory.mktemp("qwen-vl-server")
    names = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>", "image_token_id": "<|image_pad|>",
             "video_token_id": "<|video_pad|>"}
    ids = add_special_tokens(root / "hf", 280, [*names.values(), "<|im_start|>", "<|im_end|>"], QWEN_TEMPLATE)
    build_qwen_vl(root / "hf", tokens={key: ids[name] for key, name in names.items()})
    ortinf.export(root / "hf", root / "pkg", progress=False)
    return root / "pkg"


@pytest.fixture(scope="module")
def image_host():
    """A real HTTP server on 127.0.0.1 for image URLs: a PNG, a 21 MiB body, a slow answer, a body trickled a byte at a
    time, a 404, and redirects to another host name (localhost), to ftp:// and to another port of the allowed host."""
    import http.server
    import threading
    import time

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name
            if self.path == "/cat.png":
                self._send(png(5, (60, 80, 3)))
            elif self.path == "/big.png":
                self._send(b"\0" * (21 << 20))
            elif self.path == "/slow.png":
                time.sleep(3)
                self._send(png(5))
            elif self.path == "/trickle.png":  # a byte every 0.3 s: each read is quick, the whole is not
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                try:
                    for _ in range(1000):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.3)
                except OSError:
                    pass
            elif self.path in self.moves:
                self.send_response(302)
                self.send_header("Location", self.moves[self.path].format(port=self.server.server_port))
                self.end_headers()
            else:
                self.send_error(404)

        moves = {"/moved.png": "http://localhost:{port}/cat.png", "/ftp.png": "ftp://127.0.0.1/cat.png",
                 "/other-port.png": "http://127.0.0.1:1/cat.png"}

        def _send(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture(scope="module")
def client(llava_package, chat_package, qwen_package, image_host, tmp_path_factory):
    allowed = image_host.removeprefix("http://")  # 127.0.0.1:PORT: a bare host is fetched on ports 80 and 443 only
    args = [str(llava_package), str(chat_package), str(qwen_package), "--served-model-name", "llava", "--served-model-name", "text",
            "--served-model-name", "qwen", "--kv-cache-memory", "32MiB", "--allowed-media-domains", allowed,
            "--media-fetch-timeout", "1", "--limit-mm-per-prompt", "image=3"]
    with running_server(args, tmp_path_factory.mktemp("logs")) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def png(seed: int, shape=(40, 60, 3)) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def part(data: bytes, mime: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}", "detail": "low"}}


def test_chat_with_images_equals_llm_generate(client, llava_package):
    messages = [{"role": "user", "content": [part(png(0)), {"type": "text", "text": "what is this?"}]}]
    reply = client.chat.completions.create(model="llava", messages=messages, max_tokens=10, temperature=0)
    llm = LLM(llava_package)
    prompt = "user: <image>what is this?\nassistant:"  # the template's rendering of the message
    expected = llm.generate({"prompt": prompt, "multi_modal_data": {"image": png(0)}}, SamplingParams(temperature=0, max_tokens=10))[0]
    assert reply.choices[0].message.content == expected.outputs[0].text
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids) and reply.usage.prompt_tokens > 16  # the image's 16 tokens
    chunks = client.chat.completions.create(model="llava", messages=messages, max_tokens=10, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.outputs[0].text
    two = [{"role": "user", "content": [part(png(1)), {"type": "text", "text": "and"}, part(png(2, (28, 28, 3)), "image/png")]}]
    assert client.chat.completions.create(model="llava", messages=two, max_tokens=4, temperature=0).usage.prompt_tokens > 32


def test_qwen_vl_chat_with_images_equals_llm_generate(client, qwen_package):
    """Qwen2.5-VL through the chat route: the image part becomes <|vision_start|><|image_pad|><|vision_end|> in the
    template, its tokens follow the image's own size (60x80 px: 2x3 tokens; 90x55: 3x2), as LLM.generate."""
    messages = [{"role": "user", "content": [part(png(0, (60, 80, 3))), {"type": "text", "text": "what is this?"}]}]
    reply = client.chat.completions.create(model="qwen", messages=messages, max_tokens=8, temperature=0)
    prompt = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>what is this?<|im_end|>\n<|im_start|>assistant\n"
    llm = LLM(qwen_package)
    expected = llm.generate({"prompt": prompt, "multi_modal_data": {"image": png(0, (60, 80, 3))}}, SamplingParams(temperature=0, max_tokens=8))[0]
    assert reply.choices[0].message.content == expected.outputs[0].text
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    two = [{"role": "user", "content": [part(png(1, (90, 55, 3))), {"type": "text", "text": "and"}, part(png(2, (60, 80, 3)))]}]
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    prompt = f"<|im_start|>user\n{image}and{image}<|im_end|>\n<|im_start|>assistant\n"
    expected = llm.generate({"prompt": prompt, "multi_modal_data": {"image": [png(1, (90, 55, 3)), png(2, (60, 80, 3))]}},
                            SamplingParams(temperature=0, max_tokens=2))[0]
    assert client.chat.completions.create(model="qwen", messages=two, max_tokens=2).usage.prompt_tokens == len(expected.prompt_token_ids)
    import httpx

    counted = httpx.post(f"{client.base_url}".removesuffix("/v1/") + "/tokenize", json={"model": "qwen", "messages": two})
    assert counted.status_code == 200, counted.text
    assert counted.json()["count"] == len(expected.prompt_token_ids)  # each image as its own size's tokens
    pad = ortinf.manifest.Manifest.load(qwen_package).vision.image_token_id
    assert expected.prompt_token_ids.count(pad) == 12  # 3x2 + 2x3 image tokens


def test_image_urls_from_allowed_hosts(client, image_host):
    """--allowed-media-domains 127.0.0.1:PORT: an image URL there is fetched and answers as the same image inline; a
    body over 20 MiB, a fetch past --media-fetch-timeout (a slow answer, or a body trickled a byte at a time: the
    timeout bounds the whole fetch), a 404, a redirect to a host not named, to ftp:// or to another port, and any other
    port of the host are 400s, which never say why a connection failed."""
    def ask(url: str):
        return client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]}], max_tokens=6, temperature=0)

    inline = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": [
        part(png(5, (60, 80, 3))), {"type": "text", "text": "hi"}]}], max_tokens=6, temperature=0)
    fetched = ask(f"{image_host}/cat.png")
    assert fetched.choices[0].message.content == inline.choices[0].message.content
    assert fetched.usage.prompt_tokens == inline.usage.prompt_tokens
    import time

    for path, fragment in (("/big.png", "larger than 20 MiB"), ("/slow.png", "within 1 s (--media-fetch-timeout)"), ("/missing.png", "HTTP 404"),
                           ("/trickle.png", "within 1 s (--media-fetch-timeout)"), ("/moved.png", "redirects to http://localhost:"),
                           ("/ftp.png", "redirects to ftp://127.0.0.1, which"), ("/other-port.png", "redirects to http://127.0.0.1:1, which")):
        start = time.monotonic()
        with pytest.raises(openai.BadRequestError) as caught:
            ask(image_host + path)
        assert fragment in caught.value.body["message"], caught.value.body
        assert time.monotonic() - start < 4, path  # the trickle held a fetch 80 s with a 3 s timeout before
    for url in ("http://127.0.0.1/cat.png", "http://127.0.0.1:1/cat.png"):  # the allowed host on a port not named
        with pytest.raises(openai.BadRequestError) as caught:
            ask(url)
        assert "not on an allowed port" in caught.value.body["message"], caught.value.body
    assert ask(f"{image_host}/cat.png").choices  # and the server goes on


def test_slow_image_hosts_do_not_hold_other_routes(client, image_host):
    """Eight chats whose image trickles in (each holds a fetch for the 1 s timeout): /tokenize of plain text answers
    within 1.5 s meanwhile (a margin for slower CPUs; it waited for the trickle's 300 s before),
    because fetches run on the media pool (2 threads), not the shared one (6 threads here, which
    eight fetches filled: an unrelated /v1/rerank took 26 s in the attack)."""
    import concurrent.futures
    import time

    import httpx

    def ask() -> int:
        body = {"model": "qwen", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"{image_host}/trickle.png"}}, {"type": "text", "text": "hi"}]}]}
        return httpx.post(f"{client.base_url}chat/completions", json=body, timeout=60).status_code

    base = f"{client.base_url}".removesuffix("/v1/")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        pending = [pool.submit(ask) for _ in range(8)]
        time.sleep(0.3)  # the fetches under way
        start = time.monotonic()
        counted = httpx.post(f"{base}/tokenize", json={"model": "text", "prompt": "hello there"}, timeout=30)
        took = time.monotonic() - start
        codes = [p.result() for p in pending]
    assert counted.status_code == 200 and took < 1.5, took  # before the media pool: minutes
    assert set(codes) <= {400, 429}, codes  # each a timeout's 400 (or a 429 past the admission's capacity)


def test_a_request_s_images_are_bounded_in_pixels_before_decoding(client):
    """Two 6000x6000 PNGs (each under the per-image limit, 72M pixels together): a 400 read from their headers."""
    big = io.BytesIO()
    Image.new("RGB", (6000, 6000)).save(big, format="PNG")
    content = [part(big.getvalue()), part(big.getvalue()), {"type": "text", "text": "hi"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": content}], max_tokens=2)
    assert "72,000,000 pixels together: at most 64,000,000" in caught.value.body["message"], caught.value.body


@pytest.mark.parametrize(("content", "fragment"), [
    ([part(png(0)[:200])], "cannot be decoded"),
    ([part(b'<svg xmlns="http://www.w3.org/2000/svg"/>', "image/svg+xml")], "cannot be decoded"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}], "base64"),
    ([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}], "not in this server's --allowed-media-domains"),
    ([part(png(0))] * 4, "at most 3 per conversation"),
    ([{"type": "image_url", "image_url": {}}], "image_url.url"),
    ([part(png(0)), part(png(0)), {"type": "text", "text": "<image>"}], "placeholders"),
])
def test_bad_images_are_400s(client, content, fragment):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="llava", messages=[{"role": "user", "content": content}], max_tokens=2)
    assert fragment in caught.value.body["message"], caught.value.body
    assert " at 0x" not in caught.value.body["message"]  # no Python object repr (Pillow's message names its buffer)
    assert client.chat.completions.create(model="llava", messages=[{"role": "user", "content": "hi"}], max_tokens=2).choices


def test_an_image_to_a_text_model_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="text", messages=[{"role": "user", "content": [part(png(0))]}], max_tokens=2)
    assert "reads text" in caught.value.body["message"]


def test_responses_api_and_tokenize_read_images(client, llava_package):
    """The Responses API's input_image parts are the chat's image parts; /tokenize counts an image as its tokens."""
    content = [{"type": "input_image", "image_url": part(png(0))["image_url"]["url"]}, {"type": "input_text", "text": "what is this?"}]
    response = client.responses.create(model="llava", input=[{"role": "user", "content": content}], max_output_tokens=10, temperature=0)
    chat = client.chat.completions.create(model="llava", messages=[{"role": "user", "content": [part(png(0)),
                                          {"type": "text", "text": "what is this?"}]}], max_tokens=10, temperature=0)
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    import httpx

    messages = [{"role": "user", "content": [part(png(0)), {"type": "text", "text": "what is this?"}]}]
    counted = httpx.post(f"{client.base_url}".removesuffix("/v1/") + "/tokenize", json={"model": "llava", "messages": messages})
    assert counted.status_code == 200, counted.text
    assert counted.json()["count"] == chat.usage.prompt_tokens  # the image's 16 tokens, not its one placeholder


def test_ortinf_chat_with_an_image(llava_package, chat_package, tmp_path):
    """`ortinf chat PKG --image PATH`: the image goes with the first message (and every turn after, costing no second
    vision call); the replies equal LLM.generate's on the same rendered prompt; --image on a text package is one line."""
    import subprocess

    from test_cli_export import ORTINF

    (tmp_path / "cat.png").write_bytes(png(3))
    result = subprocess.run([*ORTINF, "chat", str(llava_package), "--image", str(tmp_path / "cat.png"), "-t", "0", "-n", "5",
                             "--provider", "cpu"], input="hello\n", capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    expected = LLM(llava_package).generate({"prompt": "user: <image>\nhello\nassistant:", "multi_modal_data": {"image": png(3)}},
                                           SamplingParams(temperature=0, max_tokens=5))[0].outputs[0].text
    assert result.stdout == f"{expected}\n" and "(image attached: cat.png, 60x40)" in result.stderr
    text = subprocess.run([*ORTINF, "chat", str(chat_package), "--image", str(tmp_path / "cat.png")], input="hi\n",
                          capture_output=True, text=True, timeout=300)
    assert text.returncode == 2 and "reads text: --image needs a vision-language package" in text.stderr


def test_ortinf_chat_with_an_image_on_qwen(qwen_package, tmp_path):
    """`ortinf chat --image` on Qwen2.5-VL: the image goes in as its template writes one, between the vision tokens."""
    import subprocess

    from test_cli_export import ORTINF

    (tmp_path / "cat.png").write_bytes(png(3, (60, 80, 3)))
    result = subprocess.run([*ORTINF, "chat", str(qwen_package), "--image", str(tmp_path / "cat.png"), "-t", "0", "-n", "5",
                             "--provider", "cpu"], input="hello\n", capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    prompt = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>\nhello<|im_end|>\n<|im_start|>assistant\n"
    expected = LLM(qwen_package).generate({"prompt": prompt, "multi_modal_data": {"image": png(3, (60, 80, 3))}},
                                          SamplingParams(temperature=0, max_tokens=5))[0].outputs[0].text
    assert result.stdout == f"{expected}\n"


def test_a_photo_sized_image_passes_the_body_limit(client):
    """A vision-language model's chat route takes bodies up to the audio routes' limit (26 MiB): a ~3.5 MB data URL,
    over the JSON routes' 2 MiB, is read (the text model behind the same server keeps its own limit)."""
    big = png(4, (900, 1000, 3))  # random pixels do not compress: ~2.7 MB of PNG, ~3.6 MB of base64
    assert len(big) > 2 << 20
    reply = client.chat.completions.create(model="llava", messages=[{"role": "user", "content": [part(big)]}], max_tokens=2)
    assert reply.usage.prompt_tokens > 16
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(big).decode()}}
    counted = httpx.post(f"{client.base_url}messages/count_tokens", timeout=60,  # it was 413 where /v1/messages took the image
                         json={"model": "llava", "messages": [{"role": "user", "content": [image]}]})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 16, counted.text


def test_llm_chat_with_images_equals_the_server(client, qwen_package, chat_package):
    """LLM.chat (vLLM's offline chat): OpenAI-style messages with image_url parts give the chat route's answer; two
    conversations batch; a text package chats too; a bad message is a RequestError naming it."""
    from ortinf.errors import RequestError

    messages = [{"role": "user", "content": [part(png(6, (60, 80, 3))), {"type": "text", "text": "what is this?"}]}]
    reply = client.chat.completions.create(model="qwen", messages=messages, max_tokens=6, temperature=0)
    llm = LLM(qwen_package)
    greedy = SamplingParams(temperature=0, max_tokens=6)
    other = [{"role": "user", "content": "hello there"}]
    both = llm.chat([messages, other], greedy)
    assert both[0].outputs[0].text == reply.choices[0].message.content
    assert len(both[0].prompt_token_ids) == reply.usage.prompt_tokens
    assert both[1].outputs[0].text == llm.chat(other, greedy)[0].outputs[0].text
    assert LLM(chat_package).chat([{"role": "user", "content": "hi"}], greedy)[0].outputs[0].token_ids
    with pytest.raises(RequestError, match="role"):
        llm.chat([{"role": "robot", "content": "hi"}], greedy)


def test_inspect_says_a_package_reads_images(llava_package):
    """`ortinf inspect` had no row saying a package takes images (export printed "(text-generation, fp32)")."""
    from ortinf.cli.inspect_table import manifest_rows

    rows = dict(manifest_rows(ortinf.manifest.Manifest.load(llava_package), llava_package))
    assert rows["vision"].startswith("llava image encoder, fp32 weights, 16 tokens per image, image token "), rows["vision"]
    assert "image_url" in rows["run it with"]


def test_sigterm_while_a_vision_request_is_still_fetching_its_image(llava_package, image_host, tmp_path):
    """SIGTERM with --shutdown-timeout 1 while a chat's image trickles in (a 30 s fetch limit): the client gets an
    OpenAI-shaped 503 at the drain deadline, not uvicorn's text/plain 500, and the server exits 0 at once (it took
    7.8 s with --shutdown-timeout 3: the exit joined the thread still fetching)."""
    import signal
    import threading
    import time

    import httpx

    args = [str(llava_package), "--served-model-name", "llava", "--allowed-media-domains", image_host.removeprefix("http://"),
            "--media-fetch-timeout", "30", "--shutdown-timeout", "1", "--kv-cache-memory", "16MiB"]
    with running_server(args, tmp_path) as server:
        answer = {}
        body = {"model": "llava", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"{image_host}/trickle.png"}}, {"type": "text", "text": "hi"}]}]}
        worker = threading.Thread(target=lambda: answer.update(r=httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)))
        worker.start()
        time.sleep(0.5)  # the fetch under way
        start = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        worker.join(30)
        assert server.process.wait(30) == 0
        took = time.monotonic() - start
    response = answer["r"]
    assert response.status_code == 503 and response.headers["content-type"] == "application/json", response.text
    assert response.json()["error"]["code"] == "server_shutting_down"
    assert took < 4, took
