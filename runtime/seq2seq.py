"""Seq2Seq: text encoder-decoders (Marian translation, BART; exporter/seq2seq.py) on the loop the
Whisper transcriber runs on (runtime/cross_loop.py): each source is one sequence whose encoder K/V
sit in pool blocks of its own (as many as its length needs), many sources decode together, the
cross blocks are cached by the source's ids (the same source again skips the encoder), and a short
pool preempts the latest admitted source.

Decoding is greedy from the decoder start token, with what the generation config asks of transformers'
generate at num_beams=1: `forced_bos_token_id` as the first token, `bad_words_ids` of one token never
(Marian's pad), `forced_eos_token_id` as the last token when the length runs out, EOS to stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ortinf.errors import ConfigError, RequestError
from ortinf.manifest import TEXT2TEXT, Manifest
from ortinf.runtime.cross_loop import CrossDecoderLoop, Window
from ortinf.runtime.longform import Decoding


class Seq2Seq(CrossDecoderLoop):
    def __init__(self, package_dir: str | Path, max_seqs: int = 8, block_size: int = 16, intra_op_threads: int = 0,
                 provider: str = "cpu", num_blocks: int | None = None, enable_prefix_caching: bool = True) -> None:
        manifest = Manifest.load(package_dir)
        if manifest.task != TEXT2TEXT or manifest.seq2seq is None or manifest.decoder is None:
            raise ConfigError(f"{package_dir} holds a {manifest.task} model, not a text encoder-decoder")
        spec = self.spec = manifest.seq2seq
        self._setup(package_dir, manifest, spec.max_source_positions, spec.encoder_graph, None, spec.decoder_start_token_id,
                    max_seqs, block_size, provider, intra_op_threads, num_blocks, enable_prefix_caching)
        self.pad = manifest.pad_token_id if manifest.pad_token_id is not None else 0
        self.forced_bos = self.generation.get("forced_bos_token_id")
        self.forced_eos = self.generation.get("forced_eos_token_id")

    def cross_len(self, features: np.ndarray) -> int:
        return len(features)

    def _encoder_feeds(self, batch: list[Window]) -> dict[str, np.ndarray]:
        longest = max(len(w.features) for w in batch)
        ids = np.full((len(batch), longest), self.pad, dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, window in enumerate(batch):
            ids[row, : len(window.features)] = window.features
            mask[row, : len(window.features)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def generate_ids(self, sources: Sequence[Sequence[int]], max_new_tokens: int | None = None) -> list[list[int]]:
        """Each source's generated ids (EOS not included); all sources decode together."""
        self.check_sources(sources)
        jobs = [self.submit([np.asarray(source, dtype=np.int64)], [self.decoder_start], decoding=Decoding(max_new_tokens))
                for source in sources]
        while self.busy:
            self.step()
        for job in jobs:
            if job.error is not None:
                raise job.error
        return [job.results[0] for job in jobs]

    def check_sources(self, sources: Sequence[Sequence[int]]) -> None:
        """RequestError for a source that is empty, too long, or holds ids outside the vocabulary."""
        limit = self.spec.max_source_positions
        for source in sources:
            if not 0 < len(source) <= limit:
                raise RequestError(f"a source must hold 1 to {limit} tokens, not {len(source)}", param="prompt")
            if min(source) < 0 or max(source) >= self.vocab_size:
                raise RequestError(f"source token ids must be in [0, {self.vocab_size})", param="prompt")

    def generate(self, texts: Sequence[str], max_new_tokens: int | None = None) -> list[str]:
        """Each text's output text (the package's tokenizer both ways)."""
        if self.tokenizer is None:
            raise ConfigError(f"{self.package} has no tokenizer.json (Marian's SentencePiece tokenizer has no fast form): "
                              "use generate_ids()")
        sources = [self.tokenizer.encode(text).ids for text in texts]
        return [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in self.generate_ids(sources, max_new_tokens)]

    def _scores(self, window: Window, logits: np.ndarray, output: list[int], budget: int) -> np.ndarray:
        """transformers' forced BOS (first token) and forced EOS (last token) on top of the suppressed tokens."""
        scores = super()._scores(window, logits, output, budget)
        forced = self.forced_bos if not output else self.forced_eos if len(output) + 1 >= budget else None
        if forced is not None:
            kept = scores[forced]
            scores = np.full_like(scores, -np.inf)
            scores[forced] = kept if np.isfinite(kept) else 0.0
        return scores


__all__ = ["Seq2Seq"]
