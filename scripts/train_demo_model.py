"""Trains ortinf's bundled demo model: a small Llama on the Python standard library's source.

usage (the committed checkpoint was made with the defaults, on 2 CPU cores, Python 3.11.7):

    .venv/bin/python scripts/train_demo_model.py --out ortinf/assets/demo-llama

Everything comes from the machine itself: the text is the standard library's own .py files (test
suites excluded; the PSF license allows redistribution), split into train and held-out files by a
hash of their path. The script trains a byte-level BPE tokenizer on the training files, trains the
model with a fixed seed, measures held-out loss against a unigram baseline, writes a normal Hugging
Face checkpoint (fp16 safetensors, tokenizer, chat template, generation_config.json) and a model
card with the figures and a few greedy completions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SAMPLE_PROMPTS = ["def fibonacci(n):\n", "import os\n\n\ndef list_files(path):\n", "class Stack:\n    def __init__(self):\n"]


def corpus_files(max_files: int | None = None) -> tuple[list[Path], list[Path]]:
    """(train, held-out) standard-library source files, in a fixed order; 1 file in 20 is held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "lib2to3"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    if max_files is not None:
        files = files[:max_files]
    held = [p for p in files if int(hashlib.sha256(str(p.relative_to(root)).encode()).hexdigest(), 16) % 20 == 0]
    held_set = set(held)
    return [p for p in files if p not in held_set], held


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(files: list[Path], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((read(p) for p in files), trainer)
    return tokenizer


def encode_files(tokenizer, files: list[Path]) -> np.ndarray:
    eos = tokenizer.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for encoding in tokenizer.encode_batch([read(p) for p in files]):
        ids.extend(encoding.ids)
        ids.append(eos)
    return np.array(ids, dtype=np.int32)


def build_model(vocab_size: int, args: argparse.Namespace, eos: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, initializer_range=0.02,
    )
    return LlamaForCausalLM(config)


def batches(data: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(data) - seq_len - 1, batch_size)
        chunk = np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int64)
        yield torch.from_numpy(chunk[:, :-1]), torch.from_numpy(chunk[:, 1:])


@torch.no_grad()
def held_out_loss(model, data: np.ndarray, seq_len: int, max_windows: int = 64) -> float:
    model.eval()
    losses = []
    for start in range(0, min(len(data) - seq_len - 1, max_windows * seq_len), seq_len):
        chunk = torch.from_numpy(data[start : start + seq_len + 1].astype(np.int64))[None]
        logits = model(chunk[:, :-1]).logits
        losses.append(torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:]).item())
    model.train()
    return float(np.mean(losses))


def unigram_loss(train: np.ndarray, held: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of held-out tokens under train unigram frequencies (add-one)."""
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[held].mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("ortinf/assets/demo-llama"), help="checkpoint folder to write")
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--intermediate-size", type=int, default=768)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--max-position-embeddings", type=int, default=1024)
    parser.add_argument("--max-files", type=int, default=None, help="use only the first N files (for quick tests)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    started = time.monotonic()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    train_files, held_files = corpus_files(args.max_files)
    tokenizer = train_tokenizer(train_files, args.vocab_size)
    vocab_size = tokenizer.get_vocab_size()
    eos = tokenizer.token_to_id("<|endoftext|>")
    train, held = encode_files(tokenizer, train_files), encode_files(tokenizer, held_files or train_files[-1:])
    print(f"corpus: {len(train_files)} train files ({len(train):,} tokens), {len(held_files)} held-out ({len(held):,} tokens), "
          f"vocab {vocab_size}", flush=True)

    model = build_model(vocab_size, args, eos)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params / 1e6:.2f}M parameters", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))))
    stream = batches(train, args.batch_size, args.seq_len, np.random.default_rng(args.seed))
    model.train()
    for step in range(1, args.steps + 1):
        inputs, targets = next(stream)
        logits = model(inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == args.steps:
            print(f"step {step}/{args.steps} loss {loss.item():.3f} ({time.monotonic() - started:.0f}s)", flush=True)
    train_seconds = time.monotonic() - started

    val = held_out_loss(model, held, args.seq_len)
    unigram = unigram_loss(train, held, vocab_size)
    save(model, tokenizer, args, eos)
    samples = complete(model, tokenizer, eos)
    write_card(args, num_params, len(train_files), len(held_files), len(train), len(held), vocab_size, val, unigram, train_seconds, samples)
    print(f"held-out loss {val:.3f} (perplexity {math.exp(val):.1f}); unigram {unigram:.3f} (perplexity {math.exp(unigram):.1f})")
    print(f"wrote {args.out} in {time.monotonic() - started:.0f}s")


def save(model, tokenizer, args: argparse.Namespace, eos: int) -> None:
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    args.out.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(args.out, safe_serialization=True)
    model.float()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(args.out)
    GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos).save_pretrained(args.out)


@torch.no_grad()
def complete(model, tokenizer, eos: int) -> list[tuple[str, str]]:
    model.eval()
    samples = []
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt).ids])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False, pad_token_id=eos)
        samples.append((prompt, tokenizer.decode(out[0, ids.shape[1]:].tolist())))
    return samples


def write_card(args, num_params, num_train_files, num_held_files, num_train, num_held, vocab, val, unigram, seconds, samples) -> None:
    lines = [
        "# ortinf demo llama",
        "",
        f"A {num_params / 1e6:.1f}M-parameter Llama-architecture language model trained from scratch by "
        "`scripts/train_demo_model.py` on the Python standard library's source code. It writes plausible-looking "
        "Python; it knows nothing else and is not an assistant. It exists so that `ortinf serve` shows the "
        "whole runtime on a real trained model with no download.",
        "",
        "| | |",
        "|---|---|",
        f"| architecture | LlamaForCausalLM: hidden {args.hidden_size}, {args.layers} layers, {args.heads} heads, "
        f"{args.kv_heads} KV heads, MLP {args.intermediate_size}, tied embeddings, context {args.max_position_embeddings} |",
        f"| parameters | {num_params:,} (stored as fp16 safetensors) |",
        f"| tokenizer | byte-level BPE, {vocab} tokens, trained on the same files; special tokens {', '.join(SPECIAL_TOKENS)} |",
        f"| data | CPython {'.'.join(map(str, __import__('sys').version_info[:3]))} standard library `.py` files, test suites excluded "
        f"(PSF license): {num_train_files} training files ({num_train:,} tokens), {num_held_files} held-out files ({num_held:,} tokens), "
        "split by a hash of the path |",
        f"| training | {args.steps} steps x {args.batch_size} x {args.seq_len} tokens, AdamW lr {args.lr}, cosine, seed {args.seed}, "
        f"{args.threads} CPU threads: {seconds / 60:.1f} minutes |",
        f"| held-out loss | {val:.3f} nats/token (perplexity {math.exp(val):.1f}) |",
        f"| unigram baseline | {unigram:.3f} nats/token (perplexity {math.exp(unigram):.1f}) |",
        "",
        f"Reproduce: `.venv/bin/python scripts/train_demo_model.py --out {args.out} --steps {args.steps}` "
        "(same Python version for the same data).",
        "",
        "## Greedy completions",
        "",
    ]
    for prompt, completion in samples:
        lines += ["```python", prompt + completion, "```", ""]
    (args.out / "README.md").write_text("\n".join(lines), encoding="utf-8")
    (args.out / "training.json").write_text(json.dumps({
        "steps": args.steps, "seconds": round(seconds, 1), "held_out_loss": val, "unigram_loss": unigram, "parameters": num_params,
    }, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
