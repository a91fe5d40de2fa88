"""VisionEncoder: a vision-language package's vision.onnx, run by the model runner for the images a step needs.

It holds image embeddings by digest, and holds exactly what the scheduler decides (its encoder cache:
ortinf/runtime/core/encoder_cache.py): each step it frees the digests it is told, then encodes the images it is told,
so the same image in another request, another turn or a preempted request's second admission costs no second
call while the scheduler keeps it. The images run in batched calls, as the package's family says
(ortinf/runtime/worker/vision_families/): how many images, tiles or patches one call takes, and how a call's outputs
become each image's embeddings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ortinf.kernels import library
from ortinf.manifest import VISION_MODEL_NAME, Manifest
from ortinf.providers.session import create_session
from ortinf.runtime.worker.encoder_input import PlacedImage
from ortinf.runtime.worker.vision_families import family_of


class VisionEncoder:
    def __init__(self, package_dir: str | Path, manifest: Manifest, found, intra_op_threads: int, dtype: np.dtype,
                 cpu_kernel: bool | None = None) -> None:
        graph, kernels = VISION_MODEL_NAME, None
        if manifest.vision.cpu_graph and found.provider.name == "cpu" and cpu_kernel is not False:  # a quantized tower's QMatMul graph
            kernels = library.load()
            graph = manifest.vision.cpu_graph if kernels is not None else graph
        self.graph_file = graph
        self.session, _ = create_session(Path(package_dir) / graph, found, intra_op_threads, spin=False,
                                         custom_ops_library=kernels.path if kernels is not None else None)
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.spec = manifest.vision
        self.family = family_of(manifest.vision)
        self.hidden = manifest.decoder.hidden_size
        self.dtype = dtype  # the decoder graph's image_embeds type
        self.cache: dict[str, np.ndarray] = {}  # digest -> embeddings, as the scheduler's encoder cache decides
        self.num_encoded = 0  # images run through the vision graph (the others were kept)
        self.num_calls = 0  # calls of the vision graph

    def free(self, digests: Iterable[str]) -> None:
        """Drops the embeddings of `digests` (the scheduler's encoder cache freed them)."""
        for digest in digests:
            self.cache.pop(digest, None)

    def prepare(self, images: Sequence[PlacedImage]) -> None:
        """Runs the vision graph for `images` and holds their embeddings (one the engine's re-run of a failed step
        finds held already is not run again)."""
        missing = list({p.image.digest: p for p in images if p.image.digest not in self.cache}.values())
        for batch in self._batches(missing):
            self.num_calls += 1
            embeds = self.family.encode(self._run, batch, self.spec)
            for placed, rows in zip(batch, embeds):
                self.cache[placed.image.digest] = rows.astype(self.dtype, copy=False)
                self.num_encoded += 1

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, {k: v for k, v in feeds.items() if k in self.input_names})

    def _batches(self, images: list[PlacedImage]) -> list[list[PlacedImage]]:
        """The images in calls of the family's limit (images, or their tiles or patches; one image over it is a call)."""
        batches: list[list[PlacedImage]] = []
        taken = 0
        for placed in images:
            size = 1 if self.family.per_image else len(placed.image.data)
            if not batches or taken + size > self.family.call_limit:
                batches.append([])
                taken = 0
            batches[-1].append(placed)
            taken += size
        return batches

    def chunk(self, images: Sequence[PlacedImage], start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The embeddings of the image positions in [start, end) of a sequence, and their rows from `start`
        (after they were encoded)."""
        embeds, rows = [], []
        for placed in images:
            low, high = max(start, placed.offset), min(end, placed.end)
            if low >= high:
                continue
            kept = self.cache.get(placed.image.digest)
            if kept is None:
                raise RuntimeError(f"image {placed.image.digest} has no embeddings: the scheduler's encoder cache did not have it encoded")
            if placed.rows is None:
                embeds.append(kept[low - placed.offset : high - placed.offset])
                rows.append(np.arange(low - start, high - start, dtype=np.int64))
            else:  # Idefics3: only the image tokens among the image's text take embeddings
                offsets = np.asarray(placed.rows, np.int64)
                within = (offsets >= low - placed.offset) & (offsets < high - placed.offset)
                embeds.append(kept[within])
                rows.append(offsets[within] + placed.offset - start)
        if not embeds:
            return np.zeros((0, self.hidden), self.dtype), np.zeros(0, np.int64)
        return np.concatenate(embeds), np.concatenate(rows)


__all__ = ["VisionEncoder"]
