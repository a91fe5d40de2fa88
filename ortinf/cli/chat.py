"""`ortinf chat PKG`: an interactive conversation in the terminal, each reply streamed as it is generated.

The conversation goes through the package's chat template on every turn (the prefix cache makes the
repeated history cheap). Lines starting with / are commands: /reset forgets the conversation, /exit
(or end of input) leaves. Works with a pipe too: every input line is one user turn.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ortinf.config import EngineConfig
from ortinf.engine.llm_engine import LLMEngine
from ortinf.errors import ConfigError, OrtinfError
from ortinf.sample.sampling_params import SamplingParams
from ortinf.serve.chat_template import ChatTemplate

HELP = "type a message; /reset starts over, /exit (or Ctrl-D) leaves"


def chat(package: Path, system: str | None, engine_options: dict, params: dict,
         stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> None:
    template = ChatTemplate.load(package)
    if template is None:
        raise ConfigError(f"{package} has no chat template: use `ortinf generate` for plain continuation")
    engine = LLMEngine(EngineConfig(package_dir=package, **{**engine_options, "max_num_seqs": 1}))
    if engine.tokenizer is None:
        raise ConfigError(f"{package} has no tokenizer: chat needs text")
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    interactive = stdin.isatty()
    if interactive:
        stdout.write(f"{HELP}\n")
    while True:
        if interactive:
            stdout.write("> ")
            stdout.flush()
        line = stdin.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if text.strip() in ("/exit", "/quit"):
            break
        if text.strip() == "/reset":
            messages = list(start)
            stdout.write("(conversation cleared)\n")
            continue
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        try:
            reply = _reply(engine, template, messages, params, stdout)
        except OrtinfError as exc:  # a turn the model cannot take (too long, refused by the template): say so, go on
            messages.pop()
            stdout.write(f"\nerror: {exc}\n")
            continue
        messages.append({"role": "assistant", "content": reply})


def _reply(engine: LLMEngine, template: ChatTemplate, messages: list[dict], params: dict, stdout: TextIO) -> str:
    prompt = engine.tokenizer.encode(template.render(messages), add_special_tokens=False).ids
    engine.add_request(prompt, SamplingParams(**params, output_kind="delta"))
    text = ""
    while engine.has_unfinished_requests():
        for output in engine.step():  # deltas: each output holds only the new text
            if output.error is not None:
                raise output.error
            text += output.outputs[0].text
            stdout.write(output.outputs[0].text)
            stdout.flush()
    stdout.write("\n")
    return text
