"""The chat page at / (ortinf/serve/static/chat.html) in a real browser: headless Chromium (Debian's chromium and
chromium-driver, installed by scripts/install.sh) loads it from a real server started with --api-key, is asked for the
key, lists the models, streams a reply equal to the API's at temperature 0 (rendered as Markdown), stops one, and
attaches an image to a vision model; then Markdown, code and math rendering, what model output and a model's name
cannot do (run script), conversations kept in the browser (reload, rename, export, delete), a conversation longer than
the context (oldest turns left out, said so), reasoning folded, regenerate and edit. The tiny models write random
text, so the rendering is checked on text handed to the page's own functions, and a stream on a stubbed fetch. The
last screen is kept as tests/artifacts/chat-page.png."""

from __future__ import annotations

import base64
import glob
import io
import json
import os
import re
import shutil
import time
from pathlib import Path

import httpx
import openai
import pytest
from support.server_helpers import running_server
from support.tiny_models import add_special_tokens, build_llava

import ortinf

KEY = "sk-page"
EVIL_NAME = "<img src=x onerror=window.pwned=1>"  # a served model's name: shown as text
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
LLAVA_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def server(byte_package, tmp_path_factory):
    root = tmp_path_factory.mktemp("llava-page")
    build_llava(root / "hf", add_special_tokens(root / "hf", 290, ["<image>"], LLAVA_TEMPLATE)["<image>"])
    ortinf.export(root / "hf", root / "llava", progress=False)
    args = [str(byte_package), str(root / "llava"), str(byte_package), "--served-model-name", "tiny", "--served-model-name", "llava",
            "--served-model-name", EVIL_NAME, "--kv-cache-memory", "64MiB", "--api-key", KEY]
    with running_server(args, tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        message = "Debian's chromium and chromium-driver are missing: bash scripts/install.sh installs them"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,900"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    browser.set_script_timeout(60)
    try:
        yield browser
    finally:
        browser.quit()


def wait(browser, condition, timeout: float = 60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.1).until(lambda b: condition(b))


def replies(browser) -> list:
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, ".message.assistant")


def send(browser, text: str) -> object:
    """Types `text` and Enter; returns the reply's element once its figures line shows (the reply ended)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    before = len(replies(browser))
    box = browser.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)
    wait(browser, lambda b: len(replies(b)) > before and replies(b)[-1].find_elements(By.CLASS_NAME, "stats"))
    return replies(browser)[-1]


def conversations(browser) -> list:
    """The conversations the page keeps in localStorage, the latest changed first."""
    return browser.execute_script("return Store.list()")


def rendered(browser, text: str) -> str:
    """The HTML the page's own renderer makes of `text`."""
    return browser.execute_script("const d = document.createElement('div'); Render.into(d, arguments[0]); return d.innerHTML", text)


def conversation(*turns: tuple[str, str | None], id: str = "c1") -> dict:  # noqa: A002 - the page's own key
    """A stored conversation of (question, answer) turns, in the page's shape (store.js)."""
    messages = []
    for question, answer in turns:
        messages.append({"role": "user", "content": question})
        if answer is not None:
            messages.append({"role": "assistant", "content": answer, "reasoning": "", "model": "tiny"})
    return {"id": id, "title": turns[0][0][:60], "created": 1, "updated": 1, "messages": messages}


def open_page(browser, server, stored: list | None = None, model: str = "tiny", max_tokens: int | None = None) -> None:
    """Loads the page afresh: the key set, temperature 0, `model` chosen, `stored` conversations (the first one open)."""
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    browser.execute_script("""
        localStorage.clear();
        localStorage.setItem('ortinf-api-key', arguments[0]);
        localStorage.setItem('ortinf-model', arguments[1]);
        localStorage.setItem('ortinf-temperature', '0');
        if (arguments[2]) {
            localStorage.setItem('ortinf-conversations', JSON.stringify(arguments[2]));
            localStorage.setItem('ortinf-conversation', arguments[2][0].id);
        }""", KEY, model, stored)
    browser.get(server.url + "/")
    wait(browser, lambda b: b.find_element(By.ID, "note").text == "Ready.")
    if max_tokens is not None:
        browser.execute_script("document.getElementById('max-tokens').value = arguments[0]", str(max_tokens))


def context_length(server, model: str = "tiny") -> int:
    listing = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
    return next(m["max_model_len"] for m in listing if m["id"] == model)


def test_the_page_streams_stops_and_attaches_an_image(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(server.url + "/")
    wait(browser, lambda b: "API key" in b.find_element(By.ID, "note").text)  # the models need the key
    browser.find_element(By.ID, "api-key").send_keys(KEY)
    browser.execute_script("document.getElementById('api-key').dispatchEvent(new Event('change'))")
    wait(browser, lambda b: len(Select(b.find_element(By.ID, "model")).options) == 3)
    Select(browser.find_element(By.ID, "model")).select_by_value("tiny")
    assert not browser.find_element(By.ID, "attach").is_displayed()  # a text model takes no image
    for field, value in (("temperature", "0"), ("max-tokens", "24")):
        browser.execute_script(f"document.getElementById('{field}').value = '{value}'")
    # record the reply's length at every change: a streamed reply shows partial text before the whole (how many
    # changes there are depends on how the browser batches the stream's reads, on a busy machine a handful)
    browser.execute_script("""
        window.lengths = [];
        new MutationObserver(() => {
            const reply = [...document.querySelectorAll('#messages .message.assistant .content')].pop();
            if (reply) window.lengths.push(reply.textContent.length);
        }).observe(document.getElementById('messages'), {subtree: true, characterData: true, childList: true});""")
    reply = send(browser, "weather in Paris?")
    text = reply.find_element(By.CLASS_NAME, "content").text
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    expected = api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "weather in Paris?"}], temperature=0,
                                           max_tokens=24).choices[0].message.content
    assert text and conversations(browser)[0]["messages"][1]["content"] == expected  # the reply, kept as written ...
    assert reply.find_element(By.CLASS_NAME, "content").get_attribute("innerHTML") == rendered(browser, expected)  # ... shown rendered
    whole = len(reply.find_element(By.CLASS_NAME, "content").get_attribute("textContent"))
    lengths = browser.execute_script("return window.lengths")
    assert any(0 < n < whole for n in lengths), (lengths, whole)  # shown in part before it was whole: streamed
    stats = reply.find_element(By.CLASS_NAME, "stats").text
    assert "24 tokens" in stats and "tokens/s" in stats and "length" in stats

    browser.execute_script("document.getElementById('max-tokens').value = '900'")
    box = browser.find_element(By.ID, "input")
    box.send_keys("tell me more\n")
    wait(browser, lambda b: replies(b)[-1].find_element(By.CLASS_NAME, "content").text)  # it started ...
    browser.find_element(By.ID, "stop").click()  # ... and stops
    wait(browser, lambda b: replies(b)[-1].find_elements(By.CLASS_NAME, "stats"))
    assert "stopped" in replies(browser)[-1].find_element(By.CLASS_NAME, "stats").text

    Select(browser.find_element(By.ID, "model")).select_by_value("llava")
    assert browser.find_element(By.ID, "attach").is_displayed()
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (48, 40), (200, 30, 30)).save(buffer, format="PNG")
    picture = ARTIFACTS / "red.png"
    ARTIFACTS.mkdir(exist_ok=True)
    picture.write_bytes(buffer.getvalue())
    browser.execute_script("document.getElementById('file').hidden = false")  # a file input takes keys when shown
    browser.find_element(By.ID, "file").send_keys(str(picture))
    wait(browser, lambda b: "red.png" in b.find_element(By.ID, "attached").text)
    browser.find_element(By.ID, "clear").click()
    browser.execute_script("document.getElementById('max-tokens').value = '8'")
    reply = send(browser, "what is this?")
    assert not reply.find_elements(By.CLASS_NAME, "error"), reply.text
    shown = browser.find_elements(By.CSS_SELECTOR, ".message.user img")
    assert len(shown) == 1 and shown[0].get_attribute("src").startswith("data:image/png;base64,")
    assert base64.b64decode(shown[0].get_attribute("src").split(",", 1)[1]) == picture.read_bytes()
    image_tokens = api.chat.completions.create(model="llava", max_tokens=1, messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": shown[0].get_attribute("src")}}]}]).usage.prompt_tokens
    text_tokens = api.chat.completions.create(model="llava", max_tokens=1, messages=[{"role": "user", "content": "what is this?"}]).usage
    assert image_tokens > text_tokens.prompt_tokens  # the page sent the image, as its tokens
    assert "8 tokens" in reply.find_element(By.CLASS_NAME, "stats").text
    browser.save_screenshot(str(ARTIFACTS / "chat-page.png"))
    assert (ARTIFACTS / "chat-page.png").stat().st_size > 10_000


def test_anthropic_and_ollama_images_reach_a_vision_model(server):
    """The same image through Anthropic's image block and Ollama's images: the prompt holds its tokens, as many as the
    OpenAI route's image_url part gives, and a text model's image is a 400 in each API's shape."""
    import anthropic
    import ollama
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (48, 40), (30, 200, 30)).save(buffer, format="PNG")
    data = base64.b64encode(buffer.getvalue()).decode()
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    expected = api.chat.completions.create(model="llava", max_tokens=2, temperature=0, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}, {"type": "text", "text": "what is this?"}]}])
    claude = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    message = claude.messages.create(model="llava", max_tokens=2, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}, {"type": "text", "text": "what is this?"}]}])
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == expected.usage.prompt_tokens
    assert message.content[0].text == expected.choices[0].message.content
    local = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {KEY}"})
    reply = local.chat(model="llava", messages=[{"role": "user", "content": "what is this?", "images": [buffer.getvalue()]}],
                       options={"temperature": 0, "num_predict": 2})
    text_only = local.chat(model="llava", messages=[{"role": "user", "content": "what is this?"}], options={"num_predict": 1})
    assert reply.prompt_eval_count > text_only.prompt_eval_count + 10  # the image's tokens
    with pytest.raises(anthropic.BadRequestError, match="image"):
        claude.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}])
    with pytest.raises(ollama.ResponseError, match="image"):
        local.chat(model="tiny", messages=[{"role": "user", "content": "x", "images": [buffer.getvalue()]}])


def test_the_page_files_are_open_typed_under_the_policy_and_packaged(server):
    """The page's script, style, vendored libraries and fonts come from this server, without the key (a <script src>
    sends none), each with its type and the page's Content-Security-Policy; a path that names no file needs the key
    like any other; every file of static/ (licences and the vendor README included) is package data."""
    page = httpx.get(server.url + "/")
    policy = page.headers["content-security-policy"]
    script = next(part for part in policy.split(";") if part.strip().startswith("script-src"))
    assert script.split() == ["script-src", "'self'"] and "http" not in policy  # no inline script, nothing from elsewhere
    sources = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
    assert len(sources) >= 10 and any("katex" in s for s in sources)
    types = {".js": "text/javascript", ".css": "text/css", ".woff2": "font/woff2"}
    for path in [*sources, "/static/vendor/katex/fonts/KaTeX_Main-Regular.woff2"]:
        answer = httpx.get(server.url + path)
        assert answer.status_code == 200, path
        assert answer.headers["content-type"].startswith(types[Path(path).suffix]) and answer.headers["content-security-policy"] == policy
        again = httpx.get(server.url + path, headers={"If-None-Match": answer.headers["etag"]})
        assert again.status_code == 304 and not again.content
    for path in ("/static/no-such.js", "/static/vendor/README.md", "/static/../app.py", "/static/chat.html"):
        assert httpx.get(server.url + path).status_code == 401, path
    assert httpx.get(server.url + "/static/no-such.js", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404

    root = Path(ortinf.__file__).parent
    pyproject = (root.parent / "pyproject.toml").read_text()
    patterns = re.findall(r'"([^"]+)"', re.search(r'^"ortinf" = \[(.*?)\]', pyproject, re.M).group(1))
    packaged = {Path(p) for pattern in patterns for p in glob.glob(str(root / pattern), recursive=True)}
    files = {p for p in (root / "serve" / "static").rglob("*") if p.is_file()}
    assert {p.name for p in files} >= {"LICENSE", "LICENSE-MPL", "README.md", "katex.min.js", "KaTeX_AMS-Regular.woff2"}
    assert files <= packaged, sorted(str(p) for p in files - packaged)


MARKDOWN = """# Title

Some **bold** text and `inline code`.

```python
def double(x):
    return x * 2
```

Euler: $e^{i\\pi} + 1 = 0$, and on its own line:

$$\\int_0^1 x\\,dx = \\frac{1}{2}$$

| a | b |
|---|---|
| 1 | 2 |

It costs $5 and $10."""


def test_markdown_code_and_math_render_with_a_copy_button(server, browser):
    from selenium.webdriver.common.by import By

    open_page(browser, server, [conversation(("show me", MARKDOWN))])
    content = replies(browser)[-1].find_element(By.CLASS_NAME, "content")
    assert content.find_element(By.TAG_NAME, "h1").text == "Title" and content.find_element(By.TAG_NAME, "strong").text == "bold"
    code = content.find_element(By.CSS_SELECTOR, ".code pre code.hljs.language-python")
    assert code.find_elements(By.CSS_SELECTOR, ".hljs-keyword") and code.text.startswith("def double(x):")  # highlighted
    assert content.find_element(By.CSS_SELECTOR, ":not(pre) > code").text == "inline code"
    assert content.find_element(By.CSS_SELECTOR, ".code-bar").text.startswith("python")
    assert len(content.find_elements(By.CSS_SELECTOR, ".katex")) == 2 and len(content.find_elements(By.CSS_SELECTOR, ".katex-display")) == 1
    assert not content.find_elements(By.CSS_SELECTOR, ".katex-error")
    assert "It costs $5 and $10." in content.text  # money is not math
    assert [td.text for td in content.find_elements(By.CSS_SELECTOR, "table td")] == ["1", "2"]
    browser.execute_script("window.copied = null; navigator.clipboard.writeText = async (text) => { window.copied = text; };")
    content.find_element(By.CSS_SELECTOR, ".code-bar .copy").click()
    wait(browser, lambda b: b.execute_script("return window.copied") == "def double(x):\n    return x * 2", timeout=5)
    assert content.find_element(By.CSS_SELECTOR, ".code-bar .copy").text == "Copied"
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "chat-page-markdown.png"))


XSS = ['<img src=x onerror="window.pwned=1">', "[click me](javascript:window.pwned=1)", "<script>window.pwned=1</script>",
       '<a href="javascript:window.pwned=1">a link</a>', '![pic](x" onerror="window.pwned=1)', '<svg onload="window.pwned=1"></svg>',
       "$\\href{javascript:window.pwned=1}{math link}$", '<details open ontoggle="window.pwned=1">x</details>',
       '<iframe src="javascript:window.pwned=1"></iframe>', "[spaced](  JaVaScRiPt:window.pwned=1  )",
       "<think><img src=x onerror=window.pwned=1></think>"]


def test_model_output_and_model_names_run_no_script(server, browser):
    """What a model writes goes through the sanitizer (raw HTML shows as text), and a model's name is text."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(browser, server, [conversation(("try", "<think><img src=x onerror=window.pwned=1></think>" + "\n\n".join(XSS)))])
    reply = replies(browser)[-1]
    browser.execute_script("for (const a of document.querySelectorAll('#messages a')) a.click();"
                           "for (const d of document.querySelectorAll('#messages details')) d.open = true;")
    time.sleep(0.5)
    assert browser.execute_script("return window.pwned") is None
    assert browser.execute_script("return document.querySelectorAll('#messages [onerror], #messages [onload], #messages [ontoggle], "
                                  "#messages script, #messages iframe, #messages img').length") == 0
    assert not browser.execute_script("return [...document.querySelectorAll('#messages a')]"
                                      ".some(a => /javascript:/i.test(a.getAttribute('href') || ''))")
    assert '<img src=x onerror="window.pwned=1">' in reply.find_element(By.CLASS_NAME, "content").text  # shown as text
    assert "<img src=x onerror=window.pwned=1>" in reply.find_element(By.CSS_SELECTOR, "details.reasoning").get_attribute("textContent")

    assert EVIL_NAME in [o.text for o in Select(browser.find_element(By.ID, "model")).options]
    Select(browser.find_element(By.ID, "model")).select_by_value(EVIL_NAME)
    browser.execute_script("document.getElementById('max-tokens').value = '4'")
    reply = send(browser, "hello")
    assert not reply.find_elements(By.CLASS_NAME, "error"), reply.text
    assert reply.find_element(By.CLASS_NAME, "who").text == EVIL_NAME and not reply.find_elements(By.CSS_SELECTOR, ".who *")
    browser.refresh()
    wait(browser, lambda b: b.find_element(By.ID, "note").text == "Ready.")
    assert replies(browser)[-1].find_element(By.CLASS_NAME, "who").text == EVIL_NAME
    assert browser.execute_script("return window.pwned") is None


def test_conversations_survive_a_reload_and_are_renamed_exported_and_deleted(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    def titles():
        return [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".conversation .title")]

    open_page(browser, server, [conversation(("an older one", "its answer"), id="old")], max_tokens=6)
    browser.find_element(By.ID, "clear").click()
    assert not browser.find_elements(By.CSS_SELECTOR, ".message")
    send(browser, "a new one")
    browser.refresh()
    wait(browser, lambda b: b.find_element(By.ID, "note").text == "Ready.")
    assert titles() == ["a new one", "an older one"]
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".message.user .content")] == ["a new one"]  # still open
    assert "6 tokens" in replies(browser)[-1].find_element(By.CLASS_NAME, "stats").text

    browser.find_element(By.CSS_SELECTOR, ".conversation.active .rename").click()
    box = browser.find_element(By.CSS_SELECTOR, ".conversation .rename-input")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("Renamed <b>chat</b>", Keys.ENTER)
    assert titles() == ["Renamed <b>chat</b>", "an older one"]  # a title is text

    browser.execute_script("window.exported = null; URL.createObjectURL = (blob) => { window.exported = blob; return 'blob:none'; };")
    browser.find_element(By.CSS_SELECTOR, ".conversation.active .export").click()
    exported = json.loads(browser.execute_async_script("window.exported.text().then(arguments[0])"))
    assert exported["format"] == "ortinf-chat" and exported["title"] == "Renamed <b>chat</b>"
    assert [(m["role"], m["content"]) for m in exported["messages"]][0] == ("user", "a new one")
    assert exported["messages"][1]["role"] == "assistant" and exported["messages"][1]["stats"]["completion_tokens"] == 6

    browser.find_element(By.CSS_SELECTOR, "li[data-id='old'] .title").click()
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".message .content")] == ["an older one", "its answer"]
    browser.execute_script("window.confirm = () => true;")
    browser.find_element(By.CSS_SELECTOR, "li[data-id='old'] .delete").click()
    assert titles() == ["Renamed <b>chat</b>"] and not browser.find_elements(By.CSS_SELECTOR, ".message")  # a new chat opens
    browser.refresh()
    wait(browser, lambda b: b.find_element(By.ID, "note").text == "Ready.")
    assert titles() == ["Renamed <b>chat</b>"] and [c["title"] for c in conversations(browser)] == ["Renamed <b>chat</b>"]

    # a reply still streaming when another conversation opens stops, and stays with its own conversation
    browser.execute_script("document.getElementById('max-tokens').value = '900'")
    browser.find_element(By.ID, "input").send_keys("a long one\n")
    wait(browser, lambda b: replies(b) and replies(b)[-1].find_element(By.CLASS_NAME, "content").text)
    browser.find_element(By.ID, "clear").click()
    wait(browser, lambda b: len(conversations(b)) == 2 and "stats" in conversations(b)[0]["messages"][-1])
    stored = conversations(browser)[0]
    assert stored["title"] == "a long one" and stored["messages"][-1]["stats"]["finish"] in ("stopped", "length", "stop")
    assert not browser.find_elements(By.CSS_SELECTOR, ".message") and titles() == ["a long one", "Renamed <b>chat</b>"]


def test_a_conversation_longer_than_the_context_leaves_its_oldest_turns_out(server, browser):
    """Counted by /tokenize before sending, or, without it, by the server's prompt-too-long 400: the oldest turns
    are left out, dimmed, and the reply says how many."""
    from selenium.webdriver.common.by import By

    limit = context_length(server)
    turns = [(f"question {i}: " + "q" * 150, f"answer {i}: " + "a" * 150) for i in range(limit // 300 + 2)]  # ~330 tokens a turn
    open_page(browser, server, [conversation(*turns)], max_tokens=8)
    reply = send(browser, "and now?")
    assert not reply.find_elements(By.CLASS_NAME, "error"), reply.text
    notice = reply.find_element(By.CLASS_NAME, "notice").text
    left_out = int(notice.split()[0])
    assert "left out" in notice and f"{limit} tokens" in notice and left_out % 2 == 0 and 2 <= left_out < 2 * len(turns)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".message.left-out")) == left_out
    stats = conversations(browser)[0]["messages"][-1]["stats"]
    assert stats["prompt_tokens"] + 8 <= limit and stats["prompt_tokens"] > limit // 3  # as much as fits, not just the question
    assert f"context {stats['prompt_tokens'] + 8}/{limit}" in reply.find_element(By.CLASS_NAME, "stats").text

    browser.execute_script("const real = window.fetch; window.fetch = (url, init) => url === '/tokenize' ? "
                           "Promise.resolve(new Response('{}', {status: 404})) : real(url, init);")
    reply = send(browser, "once more?")
    assert not reply.find_elements(By.CLASS_NAME, "error"), reply.text
    assert int(reply.find_element(By.CLASS_NAME, "notice").text.split()[0]) >= left_out


def test_regenerate_and_edit(server, browser):
    from selenium.webdriver.common.by import By

    open_page(browser, server, max_tokens=4)
    send(browser, "first question")
    send(browser, "second question")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".regenerate")) == 1  # the last reply's only
    browser.execute_script("document.getElementById('max-tokens').value = '7'")
    replies(browser)[-1].find_element(By.CLASS_NAME, "regenerate").click()
    wait(browser, lambda b: "7 tokens" in replies(b)[-1].find_element(By.CLASS_NAME, "stats").text if replies(b)[-1].find_elements(
        By.CLASS_NAME, "stats") else False)
    messages = conversations(browser)[0]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2 and messages[-1]["stats"]["completion_tokens"] == 7

    first = browser.find_elements(By.CSS_SELECTOR, ".message.user")[0]
    first.find_element(By.CLASS_NAME, "edit").click()
    box = first.find_element(By.CLASS_NAME, "edit-box")
    box.clear()
    box.send_keys("edited question")
    first.find_element(By.CLASS_NAME, "resend").click()
    wait(browser, lambda b: len(conversations(b)[0]["messages"]) == 2 and "stats" in conversations(b)[0]["messages"][1])
    messages = conversations(browser)[0]["messages"]
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    expected = api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "edited question"}], temperature=0,
                                           max_tokens=7).choices[0].message.content
    assert messages[0]["content"] == "edited question" and messages[1]["content"] == expected  # what came after it went
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".message.user .content")] == ["edited question"]


def test_reasoning_is_folded_and_a_reply_shows_its_speed_and_context(server, browser):
    """<think> text and a stream's reasoning_content deltas (a reasoning parser's) show folded; the figures come from
    the stream's usage (stream_options.include_usage). The stream is the stubbed fetch's: the tiny model reasons not."""
    from selenium.webdriver.common.by import By

    open_page(browser, server, [conversation(("think first", "<think>Let me see: <b>2+2</b>.</think>It is **4**."))])
    reply = replies(browser)[-1]
    details = reply.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert details.get_attribute("open") is None and details.find_element(By.TAG_NAME, "summary").text == "Thoughts"
    assert "Let me see: <b>2+2</b>." in details.get_attribute("textContent")
    assert reply.find_element(By.CSS_SELECTOR, ".content strong").text == "4"

    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "Pondering "}}]},
              {"choices": [{"index": 0, "delta": {"reasoning_content": "deeply."}}]},
              {"choices": [{"index": 0, "delta": {"content": "Here:\n```js\nlet x = 1;\n```"}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
              {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}}]
    browser.execute_script("""
        const real = window.fetch, events = arguments[0].map((c) => 'data: ' + JSON.stringify(c) + '\\n\\n').join('') + 'data: [DONE]\\n\\n';
        window.sent = null;
        window.fetch = (url, init) => {
            if (url !== '/v1/chat/completions') return real(url, init);
            window.sent = JSON.parse(init.body);
            return Promise.resolve(new Response(events, {status: 200, headers: {'Content-Type': 'text/event-stream'}}));
        };""", chunks)
    reply = send(browser, "and you?")
    details = reply.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert details.get_attribute("open") is None and details.get_attribute("textContent").strip().endswith("Pondering deeply.")
    assert reply.find_element(By.CSS_SELECTOR, ".code code.language-js .hljs-keyword").text == "let"
    stats = reply.find_element(By.CLASS_NAME, "stats").text
    assert "12 tokens" in stats and "tokens/s" in stats and f"context 42/{context_length(server)}" in stats and "stop" in stats
    sent = browser.execute_script("return window.sent")
    assert sent["stream"] and sent["stream_options"] == {"include_usage": True}
    assert sent["messages"] == [{"role": "user", "content": "think first"}, {"role": "assistant", "content": "It is **4**."},
                                {"role": "user", "content": "and you?"}]  # the reasoning is not sent back
    assert conversations(browser)[0]["messages"][-1]["reasoning"] == "Pondering deeply."
