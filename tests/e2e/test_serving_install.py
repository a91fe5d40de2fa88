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
EXPORT = ("torch==2.13.0 'transformers<4.58,>=4.55' 'optimum-onnx[onnxruntime]==0.1.0' 'onnx>=1.17' 'onnx-ir>=0.1' 'gguf>=0.10' "
          "huggingface-hub safetensors")
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
def test_a_vision_package_on_a_serving_only_install_is_one_line(tmp_path):
    """issue 33: serving a vision-language package needs the vision extra (Pillow decodes the images): one line naming
    it and the command that installs it here, before anything loads."""
    pytest.importorskip("PIL")

    from support.tiny_models import add_tokenizer, build_llava

    import ortinf

    (tmp_path / "hf").mkdir()
    add_tokenizer(tmp_path / "hf", 300)
    build_llava(tmp_path / "hf", layers=1)
    ortinf.export(tmp_path / "hf", tmp_path / "llava", progress=False)
    done = subprocess.run([str(SERVING_ONLY), "serve", str(tmp_path / "llava"), "--port", "1"], capture_output=True, text=True, timeout=120)
    python = interpreter(SERVING_ONLY)
    message = (f"error: serving {tmp_path / 'llava'} (a vision-language model) needs ortinf's 'vision' extra (pillow not installed): "
               f"{python} {PIP}'pillow>=10'")
    assert done.returncode == 2 and done.stderr.strip() == message, done.stderr
