"""EncoderGraph: an exported encoder package (embeddings or classification) under ONNX Runtime."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ortinf.errors import ConfigError, RequestError
from ortinf.manifest import MODEL_NAME, TEXT_GENERATION, EncoderSpec, Manifest
from ortinf.providers.registry import resolve
from ortinf.providers.session import create_session
from ortinf.tokenizer import check_unicode, load_checked_tokenizer, pad_token_id


class EncoderGraph:
    """Tokenises texts, pads them into a batch and runs the encoder graph."""

    def __init__(self, package_dir: str | Path, provider: str = "auto", intra_op_threads: int = 0,
                 provider_options: dict[str, str] | None = None, allow_cpu_fallback: bool = False) -> None:
        folder = Path(package_dir)
        self.manifest = Manifest.load(folder)
        if self.manifest.speech is not None:
            raise ConfigError(f"{package_dir} holds a speech-recognition model (Whisper): transcribe with "
                              "LLM(package).transcribe(audio), or serve it and use /v1/audio/transcriptions")
        if self.manifest.task == TEXT_GENERATION or self.manifest.encoder is None:
            raise ConfigError(f"{package_dir} holds a {self.manifest.task} model, not an encoder")
        self.spec: EncoderSpec = self.manifest.encoder
        self.provider = resolve(provider)
        # spin=False: an encoder is called now and then beside a decoder that steps back to back; its
        # idle threads must not spin on the decoder's cores (ortinf/providers/session.py)
        self.session, self.placement = create_session(folder / MODEL_NAME, self.provider, intra_op_threads, provider_options,
                                                      allow_cpu_fallback, spin=False)
        self.tokenizer = load_checked_tokenizer(folder, self.spec.vocab_size)
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()  # truncation is per call (the tokenizer is shared by threads)
        self.pad_id = pad_token_id(folder, self.tokenizer)

    def encode(self, texts: Sequence[str], max_length: int | None = None) -> list[list[int]]:
        """Token ids of each text, with the model's special tokens; cut to `max_length` tokens when
        given, keeping the trailing special tokens (BERT's [SEP]) as the tokenizer's own truncation does."""
        for text in texts:
            check_unicode(text, "input")
        ids = []
        for encoding in self.tokenizer.encode_batch(list(texts)):
            row = encoding.ids
            if max_length is not None and len(row) > max_length:
                mask = encoding.special_tokens_mask
                tail = 0
                while tail < len(mask) and mask[len(mask) - 1 - tail]:
                    tail += 1
                tail = min(tail, max_length - 1)
                row = row[: max_length - tail] + (row[len(row) - tail :] if tail else [])
            ids.append(row)
        return ids

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]) -> tuple[list[list[int]], list[list[int]]]:
        """(token ids, token type ids) of each (first, second) text pair, as the tokenizer's pair template
        joins them (BERT: [CLS] a [SEP] b [SEP], b's type 1); a pair beyond the context keeps its first text
        whole and cuts the second (a reranker's query and document)."""
        specials = self.tokenizer.num_special_tokens_to_add(True)
        ids, types = [], []
        for first, second in pairs:
            a = self.tokenizer.encode(check_unicode(first, "query"), add_special_tokens=False)
            b = self.tokenizer.encode(check_unicode(second, "documents"), add_special_tokens=False)
            room = self.spec.max_model_len - specials - len(a.ids)
            if room < 1:
                raise RequestError(f"the query has {len(a.ids)} tokens: with a document it must fit {self.spec.max_model_len}",
                                   param="query")
            if len(b.ids) > room:
                b.truncate(room)
            joined = self.tokenizer.post_process(a, b, add_special_tokens=True)
            ids.append(list(joined.ids))
            types.append(list(joined.type_ids))
        return ids, types

    def check(self, token_ids: Sequence[Sequence[int]]) -> None:
        """Raises RequestError for an input the graph cannot take: empty, too long, ids off the vocabulary."""
        if not token_ids or any(len(ids) == 0 for ids in token_ids):
            raise RequestError("every input must hold at least one token", param="input")
        longest = max(len(ids) for ids in token_ids)
        if longest > self.spec.max_model_len:
            raise RequestError(f"an input has {longest} tokens; this model takes at most {self.spec.max_model_len} "
                               "(shorten it, or ask for truncation with truncate_prompt_tokens)", param="input")
        vocab = self.spec.vocab_size or self.tokenizer.get_vocab_size()
        bad = next((t for ids in token_ids for t in ids if t < 0 or t >= vocab), None)
        if bad is not None:
            raise RequestError(f"token id {bad} is out of range: token ids must be in [0, {vocab})", param="input")

    def run(self, token_ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """The graph's output for a batch of token-id lists (and their token type ids, for text pairs):
        [batch, dim] embeddings or logits."""
        self.check(token_ids)
        longest = max(len(ids) for ids in token_ids)
        ids = np.full((len(token_ids), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, seq in enumerate(token_ids):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
            if type_ids is not None:
                types[row, : len(seq)] = type_ids[row]
        tensors = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return self.session.run(None, {name: tensors[name] for name in self.spec.input_names})[0]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings [len(texts), dim] (pooled, and normalised where the model says so); texts longer
        than the model's context are truncated, as sentence-transformers does."""
        return self.run(self.encode(texts, self.spec.max_model_len))
