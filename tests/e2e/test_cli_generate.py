"""`ortinf generate` as a real subprocess: streamed text equals the Python API's, errors are one line."""

from __future__ import annotations

import io

from test_cli_export import assert_user_error, ortinf

from ortinf import LLM, SamplingParams


def test_generate_streams_the_same_text_as_the_api(decoder_package):
    _, package = decoder_package("llama")
    result = ortinf("generate", package, "--prompt", "the quick brown fox", "--max-tokens", "16", "--provider", "cpu")
    assert result.returncode == 0, result.stderr
    expected = LLM(package, provider="cpu", num_blocks=64).generate("the quick brown fox", SamplingParams(temperature=0, max_tokens=16))
    assert result.stdout == expected[0].outputs[0].text + "\n"
    assert "tokens in" in result.stderr and "finish:" in result.stderr


def test_generate_errors(decoder_package, tmp_path):
    _, package = decoder_package("llama")
    assert_user_error(ortinf("generate", package, "-p", "x", "--temperature", "-1"), "Invalid value for '-t' / '--temperature'",
                      "-1.0 is not in the range 0.0<=x<=2.0")
    assert_user_error(ortinf("generate", package, "--prompt-ids", "1,2", "-n", "100000"), "beyond the context length 512")
    assert_user_error(ortinf("generate", tmp_path, "-p", "x"), "has no ortinf.json")
    assert_user_error(ortinf("generate", package, "-p", "x", "--provider", "tpu"), "unknown provider 'tpu'")
    assert_user_error(ortinf("generate", package, "-p", "x", "--kv-cache-memory", "lots"), "cannot read the size")
    assert_user_error(ortinf("generate", package, "--prompt-ids", "5,999999"), "token id 999999 is out of range", "[0, 256)")
    assert ortinf("generate", package, "-p", "def ", "--seed", "-1", "-t", "1.0", "-n", "4").returncode == 0  # any seed
    missing = ortinf("generate", package)
    assert missing.returncode == 2 and "exactly one of --prompt and --prompt-ids" in missing.stderr


def test_chat_streams_replies_through_the_template(chat_package, decoder_package):
    import subprocess

    from test_cli_export import ORTINF

    from ortinf.tasks.chat.template import ChatTemplate

    turns = "hello\n/reset\nhello\n"
    result = subprocess.run([*ORTINF, "chat", str(chat_package), "-t", "0", "-n", "6", "--provider", "cpu"], input=turns,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    llm = LLM(chat_package, provider="cpu", num_blocks=64)
    prompt = ChatTemplate.load(chat_package).render([{"role": "user", "content": "hello"}])
    ids = llm.engine.tokenizer.encode(prompt, add_special_tokens=False).ids
    reply = llm.generate([ids], SamplingParams(temperature=0, max_tokens=6))[0].outputs[0].text
    assert result.stdout == f"{reply}\n(conversation cleared)\n{reply}\n"
    _, plain = decoder_package("llama")  # exported without a chat template
    no_template = subprocess.run([*ORTINF, "chat", str(plain)], input="hi\n", capture_output=True, text=True, timeout=300)
    assert no_template.returncode == 2 and "has no chat template" in no_template.stderr


class _Terminal(io.StringIO):
    """stdout of a terminal whose user presses Ctrl-C once the first reply has written `after` pieces."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    def write(self, text: str) -> int:
        if self.after is not None and text and not text.endswith("\n"):
            self.after -= 1
            if self.after < 0:
                self.after = None
                raise KeyboardInterrupt
        return super().write(text)


def test_chat_ctrl_c_stops_the_reply_and_commands_are_not_sent(chat_package):
    """issue 31, item 9: Ctrl-C during a reply stops that reply and the chat goes on (the partial reply stays in the
    conversation); /help, /system and unknown commands are the chat's, never the model's."""
    from ortinf.cli.chat import run_chat
    from ortinf.tasks.chat.template import ChatTemplate

    stdin = io.StringIO("hello\n/help\n/nope\n//slash\n/system be terse\nhello\n/exit\nnever read\n")
    stdout = _Terminal(after=2)
    run_chat(chat_package, None, {"provider": "cpu", "num_blocks": 64}, dict(max_tokens=40, temperature=0.0, top_p=1.0, seed=None),
             stdin=stdin, stdout=stdout)
    lines = stdout.getvalue().split("\n")
    assert lines[0].endswith(" [stopped]") and lines[1] == "commands:" and "/system TEXT" in stdout.getvalue()
    assert any(line.startswith("unknown command /nope: /help lists the commands") for line in lines)
    assert "(system message set; conversation cleared)" in lines
    # the turn after /system is the template's rendering of the system message and "hello": the same as a fresh run
    llm = LLM(chat_package, provider="cpu", num_blocks=64)
    prompt = ChatTemplate.load(chat_package).render([{"role": "system", "content": "be terse"}, {"role": "user", "content": "hello"}])
    ids = llm.engine.tokenizer.encode(prompt, add_special_tokens=False).ids
    reply = llm.generate([ids], SamplingParams(temperature=0, max_tokens=40))[0].outputs[0].text
    assert lines[-2] == reply and stdin.readline() == "never read\n"


def test_chat_takes_a_multi_line_block_as_one_message(chat_package):
    """A line of three double quotes opens a message that another closes (ollama run's): one turn, its lines joined;
    a pasted block used to become several messages."""
    from ortinf.cli.chat import run_chat

    stdin = io.StringIO('"""\nfirst line\n\nthird line\n"""\nnext\n')
    messages = run_chat(chat_package, None, {"provider": "cpu", "num_blocks": 64}, dict(max_tokens=3, temperature=0.0, top_p=1.0,
                        seed=None), stdin=stdin, stdout=io.StringIO())
    assert [m["content"] for m in messages if m["role"] == "user"] == ["first line\n\nthird line", "next"]


def test_chat_in_a_terminal_edits_lines_and_recalls_history(chat_package, tmp_path):
    """In a terminal (a pty here) the prompt is readline's: Left arrow moves the cursor instead of printing ^[[D, and Up
    recalls the previous message (it printed ^[[A)."""
    import os
    import pty
    import select
    import subprocess
    import time

    from test_cli_export import ORTINF

    leader, follower = pty.openpty()
    env = {**os.environ, "HOME": str(tmp_path), "TERM": "xterm"}  # history under tmp_path/.cache
    process = subprocess.Popen([*ORTINF, "chat", str(chat_package), "-t", "0", "-n", "2", "--provider", "cpu"], stdin=follower,
                               stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    seen = b""

    def until(needle: bytes, timeout: float = 120, count: int = 1) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while seen.count(needle) < count:
            assert time.monotonic() < deadline, seen[-2000:]
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(leader, 4096)
                except OSError:
                    break

    try:
        until(b"> ")
        time.sleep(1.0)  # readline has the terminal (keys typed before it does are the line discipline's)
        os.write(leader, b"helo\x1b[Dl\r")  # "helo", Left, "l": "hello"
        until(b"\n> ", 120, count=2)  # the first prompt (after the help line), then the one after the reply
        time.sleep(1.0)
        os.write(leader, b"\x1b[A\r")  # Up: "hello" again
        until(b"hello", 30)
        os.write(leader, b"/exit\r")
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
        os.close(leader)
    text = seen.decode(errors="replace")
    assert "^[[D" not in text and "^[[A" not in text, text
    assert (tmp_path / ".cache" / "ortinf" / "chat_history").read_text().count("hello") >= 1
