"""ModelInput: the flat arrays one call of the decoder graph takes, built from per-sequence chunks.

    sequence s: | cached (context_lens[s]) | scheduled now (query_lens[s]) |
    slot of absolute position p = block_table[p // block_size] * block_size + p % block_size
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ortinf.manifest import ATTEND_UNTIL, MROPE_DELTAS
from ortinf.providers.base import Buckets, bucket


@dataclass(frozen=True, slots=True)
class SequenceChunk:
    """The tokens of one sequence scheduled in a step, after `num_computed_tokens` cached ones."""

    token_ids: Sequence[int]
    num_computed_tokens: int
    block_table: Sequence[int]
    lora_slot: int = -1  # the LoRA adapter's slot (ortinf/runtime/worker/lora.py), -1 for the base model
    cross_blocks: Sequence[int] = ()  # an encoder-decoder's cross-attention K/V blocks (Whisper), and how many
    cross_len: int = 0  # positions they hold
    image_embeds: np.ndarray | None = None  # [m, hidden]: embeddings of the image positions this chunk covers
    image_rows: np.ndarray | None = None  # [m]: their rows within the chunk
    rope_deltas: np.ndarray | None = None  # [3, len(token_ids)]: an M-RoPE graph's position offsets (ortinf/runtime/worker/mrope.py)
    attend_until: np.ndarray | None = None  # [len(token_ids)]: Gemma 3's image spans (ortinf/runtime/worker/image_spans.py)


@dataclass(frozen=True, slots=True)
class ModelInput:
    """Graph inputs of one step (int64 numpy arrays) plus the slots where the new K/V go."""

    input_ids: np.ndarray  # [num_tokens]
    positions: np.ndarray  # [num_tokens]
    block_tables: np.ndarray  # [num_seqs, max_blocks] over the cached tokens only, padded with block 0
    context_lens: np.ndarray  # [num_seqs]
    query_lens: np.ndarray  # [num_seqs]
    logits_indices: np.ndarray  # [num_seqs], the last scheduled token of each sequence
    slot_mapping: np.ndarray  # [num_tokens], pool slot of each scheduled token
    full_block_tables: np.ndarray | None = None  # [num_seqs, blocks] covering the new tokens too (the contrib kernel's)
    lora_slots: np.ndarray | None = None  # [num_tokens]: each token's LoRA slot, -1 for the base model
    cross_block_tables: np.ndarray | None = None  # [num_seqs, cross_blocks]: encoder-decoders only
    cross_lens: np.ndarray | None = None  # [num_seqs]
    image_embeds: np.ndarray | None = None  # [M, hidden]: a vision-language graph's (M may be 0)
    image_rows: np.ndarray | None = None  # [M]: their rows among the step's tokens
    rope_deltas: np.ndarray | None = None  # [3, num_tokens]: an M-RoPE graph's (zeros for text-only sequences)
    attend_until: np.ndarray | None = None  # [num_tokens]: an image-span graph's (each token's position outside images)

    @property
    def num_seqs(self) -> int:
        return int(self.query_lens.shape[0])

    def feeds(self) -> dict[str, np.ndarray]:
        cross = {} if self.cross_lens is None else {"cross_block_tables": self.cross_block_tables, "cross_lens": self.cross_lens}
        images = {} if self.image_embeds is None else {"image_embeds": self.image_embeds, "image_rows": self.image_rows}
        rope = {} if self.rope_deltas is None else {MROPE_DELTAS: self.rope_deltas}
        rope.update({} if self.attend_until is None else {ATTEND_UNTIL: self.attend_until})
        return {
            **cross,
            **images,
            **rope,
            "input_ids": self.input_ids,
            "positions": self.positions,
            "block_tables": self.block_tables,
            "context_lens": self.context_lens,
            "query_lens": self.query_lens,
            "logits_indices": self.logits_indices,
            "slot_mapping": self.slot_mapping,
        }


def build_model_input(chunks: Sequence[SequenceChunk], block_size: int, all_logits: Sequence[bool] | None = None) -> ModelInput:
    """Flattens per-sequence chunks into one ModelInput; each chunk's table must cover its tokens.

    Logits come for the last token of each chunk, or for all its tokens where `all_logits[i]` is set
    (prompt logprobs); rows come in chunk order.
    """
    query_lens = np.array([len(c.token_ids) for c in chunks], dtype=np.int64)
    context_lens = np.array([c.num_computed_tokens for c in chunks], dtype=np.int64)
    max_blocks = max(len(c.block_table) for c in chunks)
    tables = np.zeros((len(chunks), max_blocks), dtype=np.int64)
    for row, chunk in zip(tables, chunks):
        row[: len(chunk.block_table)] = chunk.block_table
        assert (chunk.num_computed_tokens + len(chunk.token_ids)) <= len(chunk.block_table) * block_size
    input_ids = np.concatenate([np.asarray(c.token_ids, dtype=np.int64) for c in chunks])
    seq_of = np.repeat(np.arange(len(chunks)), query_lens)
    starts = np.cumsum(query_lens) - query_lens
    positions = context_lens[seq_of] + (np.arange(len(input_ids)) - starts[seq_of])
    slot_mapping = tables[seq_of, positions // block_size] * block_size + positions % block_size
    # The graph reads only cached tokens from the pool (this step's K/V are written after it runs),
    # so it gets only the blocks that hold them: a fresh prompt would otherwise be scored against a
    # whole masked block table. At least one block keeps every shape non-empty.
    cached_blocks = max(1, -(-int(context_lens.max()) // block_size))
    return ModelInput(
        input_ids=input_ids,
        positions=positions,
        block_tables=np.ascontiguousarray(tables[:, :cached_blocks]),
        context_lens=context_lens,
        query_lens=query_lens,
        logits_indices=_logits_indices(starts, query_lens, all_logits),
        slot_mapping=slot_mapping,
        full_block_tables=tables,
        lora_slots=np.repeat(np.array([c.lora_slot for c in chunks], dtype=np.int64), query_lens)
        if any(c.lora_slot >= 0 for c in chunks) else None,  # None: every token runs the base model
        **_cross_tables(chunks),
        **_images(chunks, starts),
        rope_deltas=None if all(c.rope_deltas is None for c in chunks) else np.concatenate(
            [np.zeros((3, len(c.token_ids)), np.int64) if c.rope_deltas is None else c.rope_deltas for c in chunks], axis=1),
        attend_until=None if all(c.attend_until is None for c in chunks) else np.concatenate(
            [c.attend_until if c.attend_until is not None else c.num_computed_tokens + np.arange(len(c.token_ids)) for c in chunks]),
    )


def _images(chunks: Sequence[SequenceChunk], starts: np.ndarray) -> dict[str, np.ndarray]:
    """Vision-language steps: the image embeddings of every chunk, and their rows among the step's tokens."""
    if all(c.image_embeds is None for c in chunks):
        return {}
    given = [(c.image_embeds, c.image_rows + start) for c, start in zip(chunks, starts) if c.image_embeds is not None]
    return {"image_embeds": np.ascontiguousarray(np.concatenate([e for e, _ in given])),
            "image_rows": np.concatenate([r for _, r in given]).astype(np.int64)}


def _cross_tables(chunks: Sequence[SequenceChunk]) -> dict[str, np.ndarray]:
    """Encoder-decoder steps: each sequence's cross-attention blocks (padded with block 0) and lengths."""
    if not any(c.cross_len for c in chunks):
        return {}
    width = max(len(c.cross_blocks) for c in chunks)
    tables = np.zeros((len(chunks), width), dtype=np.int64)
    for row, chunk in zip(tables, chunks):
        row[: len(chunk.cross_blocks)] = chunk.cross_blocks
    return {"cross_block_tables": tables, "cross_lens": np.array([c.cross_len for c in chunks], dtype=np.int64)}


def _logits_indices(starts: np.ndarray, query_lens: np.ndarray, all_logits: Sequence[bool] | None) -> np.ndarray:
    last = starts + query_lens - 1
    if all_logits is None or not any(all_logits):
        return last
    parts = [np.arange(s, s + n) if full else last[i : i + 1] for i, (s, n, full) in enumerate(zip(starts, query_lens, all_logits))]
    return np.concatenate(parts).astype(np.int64)


def pad_to_buckets(model_input: ModelInput, buckets: Buckets, scratch_slot: int, block_size: int) -> ModelInput:
    """The step padded so that num_tokens, num_seqs, the block-table width and the logits rows are
    bucket sizes. Padding tokens belong to padding sequences (context 0, a block table of the
    scratch block, at most the step's longest query each, so the padded query length is unchanged)
    and write their K/V into the scratch block; padding logits rows repeat row 0. The caller keeps
    the real rows."""
    num_tokens, num_seqs = len(model_input.input_ids), model_input.num_seqs
    longest = int(model_input.query_lens.max())
    tokens, seqs = bucket(num_tokens, buckets.tokens), bucket(num_seqs, buckets.seqs)
    while True:
        pad_seqs, pad_tokens = seqs - num_seqs, tokens - num_tokens
        if pad_tokens and not pad_seqs:
            seqs = bucket(num_seqs + 1, buckets.seqs)
        elif pad_tokens < pad_seqs:
            tokens = bucket(num_tokens + pad_seqs, buckets.tokens)
        elif pad_tokens > pad_seqs * longest:
            seqs = bucket(num_seqs + -(-pad_tokens // longest), buckets.seqs)
        else:
            break
    lens = np.full(pad_seqs, pad_tokens // pad_seqs if pad_seqs else 0, dtype=np.int64)
    lens[: pad_tokens - int(lens.sum())] += 1  # spread the remainder: each pad sequence holds 1..longest
    tables = _pad_table(model_input.block_tables, seqs, buckets, scratch_slot // block_size)
    full = model_input.full_block_tables
    full_tables = None if full is None else _pad_table(full, seqs, buckets, scratch_slot // block_size)
    offsets = np.concatenate([np.arange(n) for n in lens]).astype(np.int64) if pad_seqs else np.zeros(0, np.int64)
    rows = len(model_input.logits_indices)
    logits_indices = np.zeros(bucket(rows, buckets.seqs), dtype=np.int64)
    logits_indices[:rows] = model_input.logits_indices
    return ModelInput(
        input_ids=np.concatenate([model_input.input_ids, np.zeros(pad_tokens, np.int64)]),
        positions=np.concatenate([model_input.positions, offsets]),
        block_tables=tables,
        context_lens=np.concatenate([model_input.context_lens, np.zeros(pad_seqs, np.int64)]),
        query_lens=np.concatenate([model_input.query_lens, lens]),
        logits_indices=logits_indices,
        slot_mapping=np.concatenate([model_input.slot_mapping, scratch_slot + offsets % block_size]),
        full_block_tables=full_tables,
        lora_slots=None if model_input.lora_slots is None else np.concatenate([model_input.lora_slots, np.full(pad_tokens, -1, np.int64)]),
        cross_block_tables=None if model_input.cross_block_tables is None else np.concatenate(
            [model_input.cross_block_tables, np.zeros((pad_seqs, model_input.cross_block_tables.shape[1]), np.int64)]),
        cross_lens=None if model_input.cross_lens is None else np.concatenate([model_input.cross_lens, np.ones(pad_seqs, np.int64)]),
        image_embeds=model_input.image_embeds,
        image_rows=model_input.image_rows,
        rope_deltas=None if model_input.rope_deltas is None else np.pad(model_input.rope_deltas, ((0, 0), (0, pad_tokens))),
        attend_until=None if model_input.attend_until is None else np.concatenate([model_input.attend_until, offsets]),
    )


def _pad_table(table: np.ndarray, seqs: int, buckets: Buckets, scratch_block: int) -> np.ndarray:
    """`table` widened to a bucket (block 0 in unused columns) with padding rows of the scratch block."""
    padded = np.zeros((seqs, bucket(table.shape[1], buckets.blocks)), dtype=np.int64)
    padded[: table.shape[0], : table.shape[1]] = table
    padded[table.shape[0] :] = scratch_block
    return padded
