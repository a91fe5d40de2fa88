"""The serving-only install (`pip install ortinf`, no torch): a command that needs an extra says which,
in one line, exit code 2. Run in .venv-openvino (a real serving-only environment: scripts/install.sh
makes it) and, everywhere, in this environment with the export modules made unimportable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVING_ONLY = ROOT / ".venv-openvino" / "bin" / "ortinf"
PIP = f"-m pip install -c {ROOT / 'constraints.txt'} "
# PyPI's Linux torch is the CUDA build: the hint adds PyTorch's CPU index (issue 44)
EXPORT = ("--extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0 'transformers<4.58,>=4.55' "
          "'optimum-onnx[onnxruntime]==0.1.0' 'onnx>=1.17' 'onnx-ir>=0.1' 'gguf>=0.10' huggingface-hub safetensors")
AUDIO = "'soundfile>=0.12' 'soxr>=0.3' 'python-multipart>=0.0.9'"


def interpreter(script: Path) -> str:
    """The Python a console script runs on (its shebang): the one whose pip the message names."""
    return script.read_text().splitlines()[0].removeprefix("#!").strip()


def expected(python: Path | str, module: str, extra: str, requirements: str) -> str:
    """The one line: the extra, and the command that installs it from where ortinf was installed (this clone)."""
    return f"error: this command needs ortinf's '{extra}' extra ({module} is not installed): {python} {PIP}{requirements}"


@pytest.mark.skipif(not SERVING_ONLY.exists(), reason=".venv-openvino (scripts/setup_openvino_env.sh) is not installed")
def test_export_in_a_serving_only_environment(tmp_path):
    done = subprocess.run([str(SERVING_ONLY), "export", str(ROOT / "ortinf" / "assets" / "demo-llama"), "-o", str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == expected(interpreter(SERVING_ONLY), "torch", "export", EXPORT), done.stderr
    assert not (tmp_path / "p").exists()


def test_export_without_torch_is_one_line(tmp_path):
    code = ("import sys; sys.modules['torch'] = None; sys.argv = ['ortinf', 'export', sys.argv[1], '-o', sys.argv[2]]; "
            "from ortinf.cli import main; main()")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "ortinf" / "assets" / "demo-llama"), str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [expected(sys.executable, "torch", "export", EXPORT)]


@pytest.mark.skipif(not SERVING_ONLY.exists(), reason=".venv-openvino (scripts/setup_openvino_env.sh) is not installed")
def test_a_speech_package_on_a_serving_only_install_is_one_line(tmp_path):
    """issue 31, item 7: serve and transcribe say which extra a Whisper package needs and the command that installs it
    here (the extra's own requirements by this environment's pip: `pip install 'ortinf[audio]'` is not on the index,
    and reinstalling ortinf would bring the stock onnxruntime back into a provider's environment)."""
    from support.server_helpers import free_port
    from support.tiny_models import add_byte_tokenizer, build_whisper

    import ortinf

    build_whisper(tmp_path / "hf", vocab_size=384, max_target_positions=24)
    add_byte_tokenizer(tmp_path / "hf", 384)
    ortinf.export(tmp_path / "hf", tmp_path / "whisper", progress=False)
    python = interpreter(SERVING_ONLY)
    served = subprocess.run([str(SERVING_ONLY), "serve", str(tmp_path / "whisper"), "--port", str(free_port())], capture_output=True,
                            text=True, timeout=120)
    assert served.returncode == 2 and served.stderr.strip().splitlines() == [
        f"error: serving {tmp_path / 'whisper'} (a speech-recognition model) needs ortinf's 'audio' extra (soundfile, soxr, "
        f"python-multipart not installed): {python} {PIP}{AUDIO}"], served.stderr
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    done = subprocess.run([str(SERVING_ONLY), "transcribe", str(tmp_path / "whisper"), str(tmp_path / "a.wav")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == expected(python, "soundfile", "audio", AUDIO), done.stderr


@pytest.mark.skipif(not SERVING_ONLY.exists(), reason=".venv-openvino (scripts/setup_openvino_env.sh) is not installed")
def test_a_vision_package_on_a_serving_only_install_serves_text(tmp_path):
    """Without Pillow, `serve` refused every model when one was a vision model, while `generate` ran it text-only:
    now it is served text-only, with a warning naming the vision extra and the command that installs it here, and a
    request with an image gets that line as its 400."""
    import base64
    import time

    import httpx
    from support.server_helpers import free_port
    from support.tiny_models import add_special_tokens, build_llava

    import ortinf

    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    build_llava(tmp_path / "hf", add_special_tokens(tmp_path / "hf", 290, ["<image>"], template)["<image>"], layers=1)
    ortinf.export(tmp_path / "hf", tmp_path / "llava", progress=False)
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([str(SERVING_ONLY), "serve", str(tmp_path / "llava"), "--port", str(port), "--served-model-name", "llava"],
                              stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.2)
        text = httpx.post(f"{url}/v1/completions", json={"model": "llava", "prompt": "hello", "max_tokens": 2}, timeout=60)
        assert text.status_code == 200, text.text
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()}}
        chat = httpx.post(f"{url}/v1/chat/completions", json={"model": "llava", "max_tokens": 2, "messages": [
            {"role": "user", "content": [image, {"type": "text", "text": "hi"}]}]}, timeout=60)
        python = interpreter(SERVING_ONLY)
        assert chat.status_code == 400 and chat.json()["error"]["message"] == (
            f"reading images needs ortinf's 'vision' extra (pillow not installed): {python} {PIP}'pillow>=10'"), chat.text
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    assert "serves text only" in (tmp_path / "server.log").read_text()
