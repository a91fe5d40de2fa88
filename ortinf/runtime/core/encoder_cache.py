"""EncoderCache: which images' embeddings the model runner holds, decided by the scheduler alone (vLLM v1's
EncoderCacheManager, counted in images).

The scheduler asks `has(digest)` (a held image costs no vision call and no encoder budget), `allocate`s the images
a scheduled chunk covers that are not held (the runner encodes exactly those this step: `to_encode`) and `use`s
the held ones; a full cache frees one first. It never frees an image a chunk of the current step covers, and
prefers images no unfinished request still has unprocessed tokens over, the least recently used first. The
digests freed since the last step go to the runner with the step (`take_freed`), which drops exactly those:
its vision encoder (ortinf/runtime/worker/vision_encoder.py) has no eviction rule of its own.

A step that fails does not leave the two apart: an image allocated in a step counts as held only once
`confirm` says a chunk covering it ran (update_from_output); `settle` frees the rest (the runner may or may
not have encoded them), which the next step passes on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from ortinf.runtime.worker.encoder_input import PlacedImage

ENCODER_CACHE_IMAGES = 256  # embeddings held: a 576-token image of a 4096-wide model is 9 MiB in fp32


class EncoderCache:
    def __init__(self, capacity: int = ENCODER_CACHE_IMAGES) -> None:
        if capacity < 1:
            raise ValueError(f"the encoder cache holds at least one image (got {capacity})")
        self.capacity = capacity
        self.held: OrderedDict[str, None] = OrderedDict()  # digests whose embeddings the runner holds, least recent first
        self.in_step: set[str] = set()  # digests a chunk of the current step covers: never freed in it
        self.to_encode: dict[str, PlacedImage] = {}  # allocated in the current step: the runner encodes them
        self.unconfirmed: set[str] = set()  # allocated in a step whose chunks are not known to have run
        self.freed: list[str] = []  # freed since the last step's output

    def has(self, digest: str) -> bool:
        return digest in self.held

    def __len__(self) -> int:
        return len(self.held)

    def begin_step(self) -> None:
        """A new step: what the last one left unconfirmed is freed, and nothing is in use."""
        self.settle()
        self.in_step.clear()
        self.to_encode = {}

    def room(self, keep: Iterable[str] = ()) -> int:
        """Images that can still be allocated in this step without freeing one in use (or one of `keep`)."""
        protected = self.in_step.union(keep)
        return self.capacity - sum(1 for digest in self.held if digest in protected)

    def use(self, digest: str) -> None:
        """A held image a chunk of this step covers: kept through the step, and the most recently used."""
        self.held.move_to_end(digest)
        self.in_step.add(digest)

    def allocate(self, placed: PlacedImage, still_needed: Callable[[], set[str]]) -> None:
        """Holds a new image for a chunk of this step (the runner encodes it); a full cache first frees an image not in
        use in this step, preferring one outside `still_needed()` (the digests unfinished requests have yet to reach)."""
        digest = placed.image.digest
        if len(self.held) >= self.capacity:
            candidates = [d for d in self.held if d not in self.in_step]
            if not candidates:
                raise RuntimeError(f"the encoder cache's {self.capacity} images are all in use this step")
            needed = still_needed()
            self.free(next((d for d in candidates if d not in needed), candidates[0]))
        self.held[digest] = None
        self.in_step.add(digest)
        self.to_encode[digest] = placed
        self.unconfirmed.add(digest)

    def free(self, digest: str) -> None:
        if digest in self.held:
            del self.held[digest]
            self.freed.append(digest)
        self.unconfirmed.discard(digest)

    def clear(self) -> None:
        """Frees every image (the runner drops them with the next step)."""
        for digest in list(self.held):
            self.free(digest)

    def end_step(self, covered: set[str]) -> tuple[tuple[PlacedImage, ...], tuple[str, ...]]:
        """This step's images to encode and digests to free. An image allocated for a chunk that was taken back (its
        request preempted later in the step) is forgotten: the runner never gets it."""
        for digest in [d for d in self.to_encode if d not in covered]:
            del self.to_encode[digest], self.held[digest]
            self.unconfirmed.discard(digest)
        # an image freed and allocated again in the same step (evicted for another, or settled after a failed step, then
        # sent again) is not freed: the runner keeps it if it has it and encodes it if not
        freed, self.freed = tuple(d for d in self.freed if d not in self.to_encode), []
        return tuple(self.to_encode.values()), freed

    def confirm(self, digests: Iterable[str]) -> None:
        """Images a chunk that ran covers: the runner holds them."""
        self.unconfirmed.difference_update(digests)

    def settle(self) -> None:
        """Frees the images allocated in a step none of whose chunks covering them ran (the runner may hold them)."""
        for digest in list(self.unconfirmed):
            self.free(digest)


__all__ = ["ENCODER_CACHE_IMAGES", "EncoderCache"]
