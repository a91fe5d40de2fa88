"""`ortinf chat PKG`: an interactive conversation in the terminal, each reply streamed as it is generated.

The conversation goes through the package's chat template on every turn (the prefix cache makes the
repeated history cheap). Lines starting with / are commands (COMMANDS; `//text` sends "/text"); the
rest are user turns. Ctrl-C during a reply stops the reply (what was written stays in the
conversation, as llama.cpp's does); at the prompt it leaves. In a terminal the line is edited with
readline (arrows, Ctrl-A/E, history with Up/Down, kept in ~/.cache/ortinf/chat_history), and a pasted
block is one turn (bracketed paste); a line of three double quotes opens a multi-line message that another
closes, as in `ollama run`. Works with a pipe too: every input line is one turn, such blocks included.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import click

from ortinf.cli.serve_options import SINGLE_STREAM_EXCLUDED, engine_options, engine_values
from ortinf.errors import ConfigError, OrtinfError

if TYPE_CHECKING:  # imported where used: `ortinf --help` does not load the engine
    from ortinf.runtime.engine.llm_engine import LLMEngine
    from ortinf.tasks.chat.chat import Chat

COMMANDS = {
    "/help": "this list",
    "/reset": "forget the conversation (the system message stays)",
    "/system TEXT": "set the system message (and start over); /system alone removes it",
    "/exit": "leave (also /quit, Ctrl-D, or Ctrl-C at the prompt)",
    "//text": "send a message that starts with /",
    '"""': 'a multi-line message, up to a line of """',
}
BLOCK = '"""'
HISTORY = Path("~/.cache/ortinf/chat_history")
HELP = "type a message; Ctrl-C stops a reply; /help lists the commands"


def _help() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name.ljust(width)}  {text}" for name, text in COMMANDS.items()]
    return "\n".join(["commands:", *lines]) + "\n"


def run_chat(package: Path, system: str | None, engine_options: dict, params: dict,
             stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout, images: tuple[Path, ...] = ()) -> list[dict]:
    """Runs the conversation until the input ends or /exit; returns its messages."""
    from ortinf.config import EngineConfig
    from ortinf.manifest import Manifest
    from ortinf.runtime.engine.llm_engine import LLMEngine
    from ortinf.tasks.chat.chat import Chat
    from ortinf.tasks.chat.template import ChatTemplate

    manifest = Manifest.load(package)  # a missing folder, a GGUF file, not a package: say that, not "no chat template"
    if images and manifest.vision is None:
        raise ConfigError(f"{package} reads text: --image needs a vision-language package (exported from LLaVA, ...)")
    if ChatTemplate.load(package) is None:  # before the engine loads
        raise ConfigError(f"{package} has no chat template: use `ortinf generate` for plain continuation")
    engine = LLMEngine(EngineConfig(package_dir=package, **{**engine_options, "max_num_seqs": 1}))
    if engine.tokenizer is None:
        raise ConfigError(f"{package} has no tokenizer: chat needs text")
    chat = Chat.load(package, engine.tokenizer, manifest.vision)
    pictures = [path.read_bytes() for path in images]  # sent with every turn: their embeddings and blocks are kept by digest
    placeholder = "".join(f"{chat.placeholder}\n" for _ in images) if images else ""
    interactive = stdin.isatty()
    read = _line_reader(stdin, stdout, interactive)
    if interactive:
        stdout.write(f"{HELP}\n")
    for path in images:  # said once (on stderr: a pipe's stdout is the replies); the image goes with the whole conversation
        sys.stderr.write(f"(image attached: {path.name}, {_size(path)})\n")
    messages = _start(system)
    while True:
        try:
            text = read("> ")
            if text is not None and text.strip() == BLOCK:  # a multi-line message, up to a line of """
                lines = []
                while (more := read("... ")) is not None and more.strip() != BLOCK:
                    lines.append(more)
                text = "\n".join(lines)
        except KeyboardInterrupt:  # Ctrl-C at the prompt leaves
            stdout.write("\n")
            break
        if text is None:
            break
        if text.startswith("/") and not text.startswith("//"):
            name, _, argument = text.strip().partition(" ")
            if name in ("/exit", "/quit"):
                break
            if name == "/help":
                stdout.write(_help())
            elif name == "/reset":
                messages = _start(system)
                stdout.write("(conversation cleared)\n")
            elif name == "/system":
                system = argument.strip() or None
                messages = _start(system)
                stdout.write("(system message set; conversation cleared)\n" if system else "(system message removed; conversation cleared)\n")
            else:
                stdout.write(f"unknown command {name[:40]}: /help lists the commands (//text sends a message starting with /)\n")
            continue
        if not text.strip():
            continue
        first = not any(m["role"] == "user" for m in messages)
        messages.append({"role": "user", "content": (placeholder if first else "") + (text[1:] if text.startswith("//") else text)})
        try:
            reply = _reply(engine, chat, messages, params, stdout, pictures)
        except OrtinfError as exc:  # a turn the model cannot take (too long, refused by the template): say so, go on
            messages.pop()
            stdout.write(f"\nerror: {exc}\n")
            continue
        messages.append({"role": "assistant", "content": reply})
    return messages


def _line_reader(stdin: TextIO, stdout: TextIO, interactive: bool):  # a function of the prompt
    """A function that reads one line (None at the end): readline's input() in a terminal (editing, history kept
    across sessions, bracketed paste), the stream's own lines otherwise."""
    if interactive and stdin is sys.stdin:
        try:
            import readline
        except ImportError:  # Windows without pyreadline: plain input() still reads whole lines
            readline = None
        history = HISTORY.expanduser()
        if readline is not None:
            try:
                readline.read_history_file(history)
            except OSError:
                pass
            readline.set_history_length(1000)

        def read(prompt: str) -> str | None:
            try:
                line = input(prompt)
            except EOFError:
                stdout.write("\n")
                return None
            if readline is not None and line.strip():
                try:
                    history.parent.mkdir(parents=True, exist_ok=True)
                    readline.write_history_file(history)
                except OSError:
                    pass
            return line

        return read

    def read_stream(prompt: str) -> str | None:
        if interactive:
            stdout.write(prompt)
            stdout.flush()
        line = stdin.readline()
        return line.rstrip("\n") if line else None

    return read_stream


def _size(path: Path) -> str:
    try:
        from PIL import Image

        with Image.open(path) as image:
            return f"{image.width}x{image.height}"
    except Exception:  # noqa: BLE001 - only a caption: the engine reports an image it cannot read
        return f"{path.stat().st_size:,} bytes"


def _start(system: str | None) -> list[dict]:
    return [{"role": "system", "content": system}] if system else []


def _reply(engine: LLMEngine, chat: Chat, messages: list[dict], params: dict, stdout: TextIO,
           images: list[bytes] | None = None) -> str:
    from ortinf.runtime.sample.sampling_params import SamplingParams
    from ortinf.tasks import driver
    from ortinf.tasks.programs import Samples

    prompt = chat.prompt(chat.parse(messages))
    prepared = engine.prepare(prompt, SamplingParams(**params), images=images or (), output_kind="delta")
    text = ""
    outputs = driver.steps(engine, [Samples([prepared], keep=False)])
    try:
        for _, _, output in outputs:  # deltas: each output holds only the new text
            text += output.outputs[0].text
            stdout.write(output.outputs[0].text)
            stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C stops this reply (the driver aborts its request), not the chat
        stdout.write(" [stopped]")
    finally:
        outputs.close()
    stdout.write("\n")
    return text


@click.command()
@click.argument("package", required=False)
@click.option("--system", default=None, help="A system message opening the conversation.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=256, show_default=True, help="Most tokens per reply.")
@click.option("-t", "--temperature", type=click.FloatRange(0.0, 2.0), default=0.7, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=0.95, show_default=True, help="Nucleus sampling mass.")
@click.option("--seed", type=int, default=None, help="Makes sampling reproducible.")
@click.option("--image", "images", type=click.Path(exists=True, dir_okay=False, path_type=Path), multiple=True,
              help="An image (PNG, JPEG, WebP, GIF) for the conversation, on a vision-language package; repeat for several.")
@engine_options(exclude=SINGLE_STREAM_EXCLUDED)
def chat(package: str | None, system: str | None, max_tokens: int, temperature: float, top_p: float, seed: int | None,
         images: tuple[Path, ...], **engine_given: object) -> None:
    """Chat with PACKAGE in the terminal, replies streamed; Ctrl-C stops a reply; /help, /reset, /system, /exit.

    PACKAGE is a folder made by `ortinf export`, a Hugging Face model folder (exported into the package
    cache on first use), or a bundled model's name; default: the bundled demo llama (ortinf-demo-llama)."""
    from ortinf.bundled import resolve_package

    run_chat(resolve_package(package), system, engine_values(engine_given),
             dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed), images=images)
