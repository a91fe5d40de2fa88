"""VisionEncoder: a vision-language package's vision.onnx, run by the model runner for the images a step needs.

Each image's embeddings are kept by digest (the newest `CACHE_IMAGES`), so the same image in another
request, another turn or a preempted request's second admission costs no second call; the images a step
needs that are not kept run in batched calls: LLaVA's have the tower's size after preprocessing and stack;
Qwen2-VL's have their own patch grids and are concatenated, up to `QWEN_PATCHES` patches per call (its
attention mask is N x N per call), with the positions and window order of ortinf/exporter/qwen_vl.py;
Idefics3's are tiles of the tower's size, concatenated (ortinf/exporter/idefics3.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ortinf.kernels import library
from ortinf.manifest import VISION_MODEL_NAME, Manifest
from ortinf.providers.session import create_session
from ortinf.runtime.worker.encoder_input import PlacedImage
from ortinf.runtime.worker.images import anyres_layout

CACHE_IMAGES = 256  # embeddings kept: a 576-token image of a 4096-wide model is 9 MiB in fp32
VISION_BATCH = 8  # images per call of the vision graph
# patches per call of a Qwen2-VL tower (more when one image has more): its full-attention layers cost N**2 per call, so
# images are batched only while small (measured at 400M: 8 images of 1024-1152 patches batched by 4096 took 4.1 s an
# image against 2.0 s alone)
QWEN_PATCHES = 1024


class VisionEncoder:
    def __init__(self, package_dir: str | Path, manifest: Manifest, found, intra_op_threads: int, dtype: np.dtype,  # noqa: ANN001
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
        self.hidden = manifest.decoder.hidden_size
        self.dtype = dtype  # the decoder graph's image_embeds type
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.num_encoded = 0  # images run through the vision graph (the others were kept)
        self.num_calls = 0  # calls of the vision graph

    def prepare(self, images: Sequence[PlacedImage]) -> None:
        """Runs the vision graph for those of `images` whose embeddings are not kept."""
        missing = list({p.image.digest: p for p in images if p.image.digest not in self.cache}.values())
        for batch in self._batches(missing):
            self.num_calls += 1
            if self.spec.family == "llava":
                (embeds,) = self.session.run(None, {"pixel_values": np.ascontiguousarray(np.stack([p.image.data for p in batch]))})
            elif self.spec.family in ("llava_next", "idefics3"):  # each image is tiles: one call over all, then per image
                tiles, *newline = self.session.run(None, {"pixel_values": np.ascontiguousarray(np.concatenate([p.image.data for p in batch]))})
                bounds = np.cumsum([0] + [len(p.image.data) for p in batch])
                embeds = [pack_anyres(tiles[a:b], newline[0], p.grid, self.spec.processor) if newline  # LLaVA-NeXT's grid with newlines
                          else tiles[a:b].reshape(-1, tiles.shape[-1]) for a, b, p in zip(bounds[:-1], bounds[1:], batch)]
            else:
                feeds, orders = qwen_vision_feeds([(p.image.data, p.grid) for p in batch], self.spec.merge_size,
                                                  int(self.spec.processor.get("window_units", 0)))
                (flat,) = self.session.run(None, {k: v for k, v in feeds.items() if k in self.input_names})
                embeds, start = [], 0
                for order in orders:  # back from window order to the image's raster order
                    rows = np.empty_like(flat[start : start + len(order)])
                    rows[order] = flat[start : start + len(order)]
                    embeds.append(rows)
                    start += len(order)
            for placed, rows in zip(batch, embeds):
                self.cache[placed.image.digest] = rows.astype(self.dtype, copy=False)
                self.num_encoded += 1
        for placed in images:
            self.cache.move_to_end(placed.image.digest)
        while len(self.cache) > max(CACHE_IMAGES, len(images)):
            self.cache.popitem(last=False)

    def _batches(self, images: list[PlacedImage]) -> list[list[PlacedImage]]:
        if self.spec.family == "llava":
            return [images[i : i + VISION_BATCH] for i in range(0, len(images), VISION_BATCH)]
        limit = QWEN_PATCHES if self.spec.family == "qwen2_vl" else 2 * VISION_BATCH  # patches, or tiles, per call
        batches: list[list[PlacedImage]] = []
        patches = 0
        for placed in images:
            if not batches or patches + len(placed.image.data) > limit:
                batches.append([])
                patches = 0
            batches[-1].append(placed)
            patches += len(placed.image.data)
        return batches

    def chunk(self, images: Sequence[PlacedImage], start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The embeddings of the image positions in [start, end) of a sequence, and their rows from `start`
        (after `prepare` for these images)."""
        embeds, rows = [], []
        for placed in images:
            low, high = max(start, placed.offset), min(end, placed.end)
            if low >= high:
                continue
            kept = self.cache[placed.image.digest]
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


def pack_anyres(tiles: np.ndarray, newline: np.ndarray, size: tuple[int, int], processor: dict) -> np.ndarray:
    """LLaVA-NeXT's pack_image_features for one image: the whole image's tokens, then the tiles' tokens as one grid
    (tile rows x tile columns of side x side), unpadded to the image's aspect, each row followed by the newline
    embedding."""
    rows, cols, keep_rows, keep_cols = anyres_layout(size[0], size[1], processor)
    side = processor["tokens_per_side"]
    grid = tiles[1:].reshape(rows, cols, side, side, -1).transpose(0, 2, 1, 3, 4).reshape(rows * side, cols * side, -1)
    grid = grid[keep_rows, keep_cols]
    grid = np.concatenate([grid, np.broadcast_to(newline, (grid.shape[0], 1, grid.shape[2]))], axis=1)
    return np.concatenate([tiles[0], grid.reshape(-1, grid.shape[2])])


def window_order(rows: int, cols: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2.5-VL's get_window_index for one image of rows x cols merged tokens: the tokens in window order
    (windows of window x window tokens, row-major, clipped at the edges; each window row-major) and each one's
    window. window 0: raster order, one window."""
    index = np.arange(rows * cols).reshape(rows, cols)
    if not window:
        return index.reshape(-1), np.zeros(rows * cols, np.int64)
    padded = np.full((rows + window - rows % window, cols + window - cols % window), -1)
    padded[:rows, :cols] = index
    windows = padded.reshape(padded.shape[0] // window, window, padded.shape[1] // window, window).transpose(0, 2, 1, 3)
    windows = windows.reshape(-1, window * window)
    order = np.concatenate([w[w >= 0] for w in windows])
    ids = np.concatenate([np.full(int((w >= 0).sum()), i) for i, w in enumerate(windows)])
    return order, ids.astype(np.int64)


def qwen_vision_feeds(images: Sequence[tuple[np.ndarray, tuple[int, int]]], merge: int,
                      window: int) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The Qwen2-VL vision graph's inputs for images given as (patches in the processor's order, token grid):
    patches, their (row, column) and image and window ids, all in window order; and each image's token order
    (ortinf/exporter/qwen_vl.py)."""
    unit = merge * merge
    parts: dict[str, list[np.ndarray]] = {"pixel_values": [], "patch_positions": [], "image_ids": [], "window_ids": []}
    orders, windows_before = [], 0
    for number, (patches, (rows, cols)) in enumerate(images):
        order, ids = window_order(rows, cols, window)
        tokens = np.arange(rows * cols)
        within = np.arange(unit)
        patch_rows = ((tokens // cols)[:, None] * merge + within[None, :] // merge)[order].reshape(-1)
        patch_cols = ((tokens % cols)[:, None] * merge + within[None, :] % merge)[order].reshape(-1)
        parts["pixel_values"].append(patches.reshape(rows * cols, unit, -1)[order].reshape(rows * cols * unit, -1))
        parts["patch_positions"].append(np.stack([patch_rows, patch_cols], axis=-1).astype(np.int64))
        parts["image_ids"].append(np.full(rows * cols * unit, number, np.int64))
        parts["window_ids"].append(np.repeat(ids + windows_before, unit))
        windows_before += int(ids.max()) + 1
        orders.append(order)
    feeds = {k: np.ascontiguousarray(np.concatenate(v)) for k, v in parts.items()}
    feeds.update(window_gather(feeds.pop("window_ids")))
    return feeds, orders


def window_gather(window_ids: np.ndarray) -> dict[str, np.ndarray]:
    """The windowed layers' gather (ortinf/exporter/qwen_vl.py): each window's patches (contiguous, in order) padded to
    the largest window, which of them are real, and each patch's slot in the flattened windows."""
    counts = np.bincount(window_ids)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    width = int(counts.max())
    offsets = np.arange(width)
    mask = offsets[None, :] < counts[:, None]
    index = np.where(mask, starts[:, None] + offsets[None, :], 0)
    slot = window_ids * width + (np.arange(len(window_ids)) - starts[window_ids])
    return {"window_index": index.astype(np.int64), "window_mask": mask.astype(np.int64), "patch_slot": slot.astype(np.int64)}


__all__ = ["VisionEncoder", "pack_anyres", "qwen_vision_feeds", "window_gather", "window_order"]
