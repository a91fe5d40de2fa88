"""The chat page at / (ortinf/serve/static/chat.html) in a real browser: headless Chromium (Debian's chromium and
chromium-driver, installed by scripts/install.sh) loads it from a real server started with --api-key, is asked for the
key, lists the models, streams a reply equal to the API's at temperature 0, stops one, and attaches an image to a
vision model. The last screen is kept as tests/artifacts/chat-page.png."""

from __future__ import annotations

import base64
import io
import os
import shutil
from pathlib import Path

import openai
import pytest
from support.server_helpers import running_server
from support.tiny_models import add_special_tokens, build_llava

import ortinf

KEY = "sk-page"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
LLAVA_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def server(byte_package, tmp_path_factory):
    root = tmp_path_factory.mktemp("llava-page")
    build_llava(root / "hf", add_special_tokens(root / "hf", 290, ["<image>"], LLAVA_TEMPLATE)["<image>"])
    ortinf.export(root / "hf", root / "llava", progress=False)
    args = [str(byte_package), str(root / "llava"), "--served-model-name", "tiny", "--served-model-name", "llava",
            "--kv-cache-memory", "64MiB", "--api-key", KEY]
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


def test_the_page_streams_stops_and_attaches_an_image(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(server.url + "/")
    wait(browser, lambda b: "API key" in b.find_element(By.ID, "note").text)  # the models need the key
    browser.find_element(By.ID, "api-key").send_keys(KEY)
    browser.execute_script("document.getElementById('api-key').dispatchEvent(new Event('change'))")
    wait(browser, lambda b: len(Select(b.find_element(By.ID, "model")).options) == 2)
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
    assert text.strip() == expected.strip() and text  # what the page shows is the reply (edges aside: Selenium trims them)
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
