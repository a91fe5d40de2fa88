"""GGUF files in (llama.cpp's and Ollama's model files): `ortinf export model.gguf -o pkg`.

transformers reads the GGUF (the architecture and tokenizer from its metadata, the weights dequantized to fp32);
that model is written as a Hugging Face folder in a temporary place and exported from there like any other, at
the `--dtype` asked for, or by default at the file's own precision (`file_quantization`: Q8_0 and Q4_0 files keep
their values exactly at int8 / int4). Before transformers reads a file, `open_index` checks its header and tensor
index, so a corrupt or hollow file is one ExportError line.

The design (which GGML types export to what and why, the checks): docs/exporter.md, "GGUF files"."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ortinf.errors import ExportError

# a GGUF weight type -> (the package dtype that holds it, its block size, whether the values are kept exactly)
TYPES: dict[str, tuple[str, int | None, bool]] = {
    "F32": ("fp32", None, True), "F16": ("fp32", None, True), "BF16": ("fp32", None, True),
    "Q8_0": ("int8", 32, True), "Q4_0": ("int4", 32, True),
    "Q4_1": ("int4", 32, False), "Q5_0": ("int8", 32, False), "Q5_1": ("int8", 32, False),
    "Q2_K": ("int4", 32, False), "Q3_K": ("int4", 32, False), "Q4_K": ("int4", 32, False),
    "Q5_K": ("int8", 32, False), "Q6_K": ("int8", 32, False), "Q8_K": ("int8", 32, False),
}


@dataclass(frozen=True, slots=True)
class FileQuantization:
    """What a GGUF's transformer-block matrices are stored as, and the export that holds them."""

    kind: str  # the most common type of the block matrices, by weight count ("Q4_K", "Q8_0", ...)
    dtype: str
    block_size: int | None
    exact: bool  # the package keeps the file's values (Q8_0, Q4_0, floats)
    kinds: dict[str, int]  # every type of the block matrices -> its weight count

    def describe(self) -> str:
        mix = ", ".join(f"{k} {n / sum(self.kinds.values()):.0%}" for k, n in sorted(self.kinds.items(), key=lambda kv: -kv[1]))
        if self.dtype == "fp32":
            return f"its matrices are {mix}: exporting at fp32"
        how = "the file's own values (no second rounding)" if self.exact else "re-quantized by ortinf's rule through the quality gate"
        return f"its matrices are {mix}: exporting at {self.dtype} in blocks of {self.block_size}, {how}"


def open_index(path: Path):  # a gguf.GGUFReader
    """The GGUF's reader (header and tensor index, the weights memory-mapped, not read), checked as docs/exporter.md
    ("GGUF files") says; ExportError naming the fault otherwise."""
    try:
        import gguf
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("reading GGUF files needs the gguf package", name="gguf") from exc
    try:
        reader = gguf.GGUFReader(str(path))
    except OSError as exc:
        raise ExportError(f"cannot read the GGUF file {path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # a corrupt header raises whatever numpy and struct raise on it
        raise ExportError(f"cannot read the GGUF file {path}: its header is corrupt or truncated ({type(exc).__name__}); "
                          "download or convert it again") from exc
    check_weights(reader, path)
    return reader


def _field(reader, key: str):  # a GGUFReader; the field's value or None
    field = reader.fields.get(key)
    try:
        return field.contents() if field is not None else None
    except Exception:  # noqa: BLE001 - a malformed value reads as absent; the checks below then name what is missing
        return None


def check_weights(reader, path: Path) -> None:  # a GGUFReader
    """ExportError unless every tensor lies inside the file and the file holds the weights its metadata declares."""
    size = path.stat().st_size
    names = set()
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > size or tensor.data.nbytes != tensor.n_bytes:
            raise ExportError(f"{path.name}: tensor {tensor.name} lies past the end of the file (truncated): download or convert it again")
        names.add(tensor.name)
    architecture = _field(reader, "general.architecture")
    layers = _field(reader, f"{architecture}.block_count") if isinstance(architecture, str) else None
    if not isinstance(layers, int) or not 0 < layers <= 1024:
        raise ExportError(f"{path.name}: its metadata gives no layer count ({architecture}.block_count): not a model file ortinf reads")
    if not any(n.startswith("token_embd.") for n in names):
        raise ExportError(f"{path.name} holds no token embedding (token_embd.weight): the file is incomplete")
    lacking = [i for i in range(layers) if not (any(n.startswith(f"blk.{i}.attn") for n in names)
                                                and any(n.startswith(f"blk.{i}.ffn") for n in names))]
    if lacking:
        which = f"layers {lacking[0]}-{lacking[-1]}" if len(lacking) > 1 else f"layer {lacking[0]}"
        raise ExportError(f"{path.name} declares {layers} layers but holds no attention or feed-forward weights for {which} "
                          f"({len(lacking)} of {layers}): the file is incomplete")


def file_quantization(path: Path) -> FileQuantization:
    """The quantization of a GGUF's transformer blocks (the embedding and output matrices aside), read from
    its tensor index without loading the weights."""
    reader = open_index(path)
    kinds: Counter[str] = Counter()
    for tensor in reader.tensors:
        if tensor.name.startswith("blk.") and len(tensor.shape) == 2:
            kinds[tensor.tensor_type.name] += int(tensor.n_elements)
    if not kinds:
        return FileQuantization("F32", "fp32", None, True, {})
    kind = kinds.most_common(1)[0][0]
    if kind not in TYPES:
        raise ExportError(f"{path.name} stores its weights as {kind}, which ortinf does not read: convert it to Q8_0, Q4_0, a K-quant or "
                          "F16 with llama.cpp's llama-quantize, or export the Hugging Face folder")
    dtype, block_size, exact = TYPES[kind]
    exact = exact and all(TYPES.get(k, ("", None, False))[2] and TYPES[k][0] in ("fp32", dtype) for k in kinds)
    return FileQuantization(kind, dtype, block_size, exact, dict(kinds))


def gguf_to_folder(path: Path, folder: Path) -> Path:
    """Writes the GGUF at `path` into `folder` as a Hugging Face model folder (config, fp32 weights, tokenizer)."""
    import torch
    import transformers

    open_index(path)  # the header and the weights' presence checked before transformers allocates the model
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except (ValueError, KeyError, RuntimeError, OSError, NotImplementedError, IndexError, TypeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"cannot read the GGUF file {path}: {first[:200]} (transformers reads the GGUFs of llama, mistral, qwen2, "
                          "qwen3, phi3, gemma2/3, ... ; export the Hugging Face folder instead if it has one)") from exc
    _keep_token_ids(tokenizer, path)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)  # api.export runs this under without_vocab_hole_warnings
    return folder


def _keep_token_ids(tokenizer, path: Path) -> None:  # a transformers fast tokenizer
    """The file's control and user-defined tokens keep the ids the file gives them. transformers' converter re-adds
    a family's special tokens (Qwen2: <|endoftext|>, <|im_start|>, <|im_end|>) in its own order after the BPE
    vocabulary, which left the file's ids as holes and shifted the tokens (the manifest's EOS id, read from the file,
    then named another token); their ids also fill the vocabulary's holes, which the tokenizers library warned about
    at every save ("your vocabulary could be corrupted")."""
    import json

    import gguf
    from tokenizers import Tokenizer

    reader = gguf.GGUFReader(str(path))
    tokens, types = reader.fields.get("tokenizer.ggml.tokens"), reader.fields.get("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        return
    special = (int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED))
    ids: dict[str, int] = {}
    for index, (part, kind) in enumerate(zip(tokens.data, types.data)):
        if int(types.parts[kind][0]) in special:
            ids.setdefault(bytes(tokens.parts[part]).decode("utf-8", errors="replace"), index)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    added = [token for token in spec.get("added_tokens", []) if token["content"] in ids]
    vocab = spec.get("model", {}).get("vocab")
    if not added or not isinstance(vocab, dict):
        return
    for token in added:
        token["id"] = ids[token["content"]]
    taken = {token["id"] for token in added}
    for text in [text for text, index in vocab.items() if index in taken and text not in ids]:
        del vocab[text]  # a BPE token the converter put on an id the file gives a special token
    vocab.update({token["content"]: token["id"] for token in added})
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(spec))


@contextlib.contextmanager
def without_vocab_hole_warnings():
    """The tokenizers library prints "The OrderedVocab you are attempting to save contains holes ..., your vocabulary
    could be corrupted!" straight to the process's stdout (fd 1, Rust's println) at every save of a vocabulary with holes, which a GGUF
    file's leaves where it repeats a special token past the tokenizer (the ids are the file's, checked by
    _keep_token_ids): those lines are dropped, everything else (progress bars included) passes on as it is written."""
    import os
    import re
    import sys
    import threading

    hole = re.compile(rb"The OrderedVocab you are attempting to save contains holes[^\n]*\n?")
    sys.stdout.flush()
    saved = os.dup(1)
    reader, writer = os.pipe()
    os.dup2(writer, 1)
    os.close(writer)

    def forward() -> None:
        while chunk := os.read(reader, 65536):
            os.write(saved, hole.sub(b"", chunk))

    thread = threading.Thread(target=forward, daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)  # the pipe's last writer closes: the thread reads to its end
        thread.join(5)
        os.close(reader)
        os.close(saved)
