"""VisionEncoder: a vision-language package's vision.onnx, run by the model runner for the images a step needs.

Each image's embeddings are kept by digest (the newest `CACHE_IMAGES`), so the same image in another
request, another turn or a preempted request's second admission costs no second call; the images a step
needs that are not kept run in one batched call (after preprocessing they all have the tower's size).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ortinf.manifest import VISION_MODEL_NAME, Manifest
from ortinf.providers.session import create_session
from ortinf.worker.encoder_input import EncoderInput, PlacedImage

CACHE_IMAGES = 256  # embeddings kept: a 576-token image of a 4096-wide model is 9 MiB in fp32
VISION_BATCH = 8  # images per call of the vision graph


class VisionEncoder:
    def __init__(self, package_dir: str | Path, manifest: Manifest, found, intra_op_threads: int, dtype: np.dtype) -> None:  # noqa: ANN001
        self.session, _ = create_session(Path(package_dir) / VISION_MODEL_NAME, found, intra_op_threads, spin=False)
        self.hidden = manifest.decoder.hidden_size
        self.dtype = dtype  # the decoder graph's image_embeds type
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.num_encoded = 0  # images run through the vision graph (the others were kept)

    def prepare(self, images: Sequence[EncoderInput]) -> None:
        """Runs the vision graph for those of `images` whose embeddings are not kept."""
        missing = list({i.digest: i for i in images if i.digest not in self.cache}.values())
        for start in range(0, len(missing), VISION_BATCH):
            batch = missing[start : start + VISION_BATCH]
            (embeds,) = self.session.run(None, {"pixel_values": np.ascontiguousarray(np.stack([i.data for i in batch]))})
            for image, rows in zip(batch, embeds):
                self.cache[image.digest] = rows.astype(self.dtype, copy=False)
                self.num_encoded += 1
        for image in images:
            self.cache.move_to_end(image.digest)
        while len(self.cache) > max(CACHE_IMAGES, len(images)):
            self.cache.popitem(last=False)

    def chunk(self, images: Sequence[PlacedImage], start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The embeddings of the image positions in [start, end) of a sequence, and their rows from `start`
        (after `prepare` for these images)."""
        embeds, rows = [], []
        for placed in images:
            low, high = max(start, placed.offset), min(end, placed.end)
            if low < high:
                embeds.append(self.cache[placed.image.digest][low - placed.offset : high - placed.offset])
                rows.append(np.arange(low - start, high - start, dtype=np.int64))
        if not embeds:
            return np.zeros((0, self.hidden), self.dtype), np.zeros(0, np.int64)
        return np.concatenate(embeds), np.concatenate(rows)


__all__ = ["VisionEncoder"]
