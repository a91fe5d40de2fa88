"""Proposals from a draft model: a second, smaller exported package with the same tokenizer.

The draft keeps its own paged KV pool (its own DecoderGraph: another model's K/V), its blocks
accounted by a KVCacheManager of its own (the engine's one home for block reservation, without prefix
caching), and, per request, the tokens whose K/V it holds. Each step, for the decoding requests that may speculate, it
catches up on the tokens the target accepted since (one batched call: the whole prompt the first
time, then the kept proposals and the target's token) and proposes k tokens greedily, one batched
graph call per token. Its K/V past the tokens the target keeps is simply not trusted next time: the
request's history is cut to the prefix it shares with the target's tokens. Proposals are verified
by the target exactly as n-gram proposals are (ortinf/runtime/sample/speculative.py), so greedy output is
unchanged whatever the draft says.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ortinf.errors import ConfigError
from ortinf.manifest import Manifest
from ortinf.providers.registry import Found
from ortinf.runtime.core.kv_cache_manager import KVCacheManager
from ortinf.runtime.worker.call_planner import plan_calls
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input
from ortinf.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


def check_same_tokenizer(draft_dir: Path, target_dir: Path) -> None:
    """Refuses a draft whose tokenizer maps tokens to other ids than the target's."""
    draft, target = Manifest.load(draft_dir), Manifest.load(target_dir)
    if draft.decoder is None:
        raise ConfigError(f"the draft model {draft_dir} is a {draft.task} package; a draft must be a text-generation package")
    if not (draft.has_tokenizer and target.has_tokenizer):
        raise ConfigError("a draft model needs a tokenizer in both packages, to check that they share it")
    if load_tokenizer(draft_dir).get_vocab(with_added_tokens=True) != load_tokenizer(target_dir).get_vocab(with_added_tokens=True):
        raise ConfigError(f"the draft model {draft_dir} has another tokenizer than the target: its proposals would be other tokens")


class DraftProposer:
    """Greedy proposals from a draft package, batched over the requests that speculate."""

    def __init__(self, draft_dir: Path, target_dir: Path, num_speculative_tokens: int, num_blocks: int, block_size: int,
                 provider: Found, intra_op_threads: int = 0, provider_options: dict[str, str] | None = None,
                 bf16_math: str = "bf16") -> None:
        check_same_tokenizer(draft_dir, target_dir)
        self.k = num_speculative_tokens
        self.block_size = block_size
        # spin=False: the target's decoder steps right after the draft's calls, on the same cores
        self.graph = DecoderGraph(draft_dir, num_blocks, block_size, provider, intra_op_threads, provider_options, spin=False,
                                  bf16_math=bf16_math)
        self.max_model_len = self.graph.spec.max_model_len
        self.kv_cache = KVCacheManager(num_blocks, block_size, enable_caching=False)
        self.history: dict[str, list[int]] = {}  # per request: the tokens whose K/V the draft pool holds

    def propose(self, requests: Sequence[tuple[str, Sequence[int], int]]) -> dict[str, list[int]]:
        """{request id: up to `limit` proposed tokens} for (request id, all token ids, limit) each."""
        chunks: dict[str, SequenceChunk] = {}
        for request_id, tokens, limit in requests:
            if limit <= 0 or len(tokens) + self.k > self.max_model_len:
                continue
            kept = _common_prefix(self.history.get(request_id, []), tokens)
            kept = min(kept, len(tokens) - 1)  # the last token is always computed: its logits propose the first draft
            if not self.kv_cache.reserve(request_id, len(tokens) + self.k):
                continue  # the draft pool is full: this request goes without proposals this step
            chunks[request_id] = SequenceChunk(list(tokens[kept:]), kept, self.kv_cache.block_ids(request_id))
            self.history[request_id] = list(tokens)
        if not chunks:
            return {}
        ids = list(chunks)
        drafts: dict[str, list[int]] = {rid: [] for rid in ids}
        current = [chunks[rid] for rid in ids]
        for step in range(self.k):
            next_tokens = self._greedy(current)
            for rid, token in zip(ids, next_tokens):
                drafts[rid].append(token)
            if step + 1 < self.k:  # feed the proposal back: its K/V is written by the next call
                current = [SequenceChunk([token], len(self.history[rid]) + step, chunk.block_table)
                           for rid, token, chunk in zip(ids, next_tokens, current)]
        for rid in ids:
            self.history[rid] += drafts[rid][:-1]  # the last proposal's K/V was never written
        limits = {rid: limit for rid, _, limit in requests}
        return {rid: drafts[rid][: limits[rid]] for rid in ids}

    def _greedy(self, chunks: list[SequenceChunk]) -> list[int]:
        tokens = [0] * len(chunks)
        lens = [len(c.token_ids) for c in chunks]
        for group in plan_calls(lens, [c.num_computed_tokens for c in chunks], self.block_size):
            logits = self.graph.run(build_model_input([chunks[i] for i in group], self.block_size))
            for row, index in enumerate(group):
                tokens[index] = int(logits[row].argmax())
        return tokens

    def release(self, request_ids: Sequence[str]) -> None:
        """Frees the draft blocks of finished requests."""
        for request_id in request_ids:
            self.history.pop(request_id, None)
            self.kv_cache.free_id(request_id)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
