"""CrossEncoder: an encoder-decoder's encoder graph, run by the model runner for the requests admitted
this step whose encoder output the pool does not hold; it writes their cross-attention K/V into their
cross blocks (ortinf/exporter/whisper.py explains why the cross K/V sit in the pool).

A host pool (CPU, OpenVINO) gets the encoder's outputs written by numpy; a device pool (WebGPU, CUDA)
is written by the encoder graph itself, in place (ortinf/exporter/whisper.py pool_write_encoder), so the K/V
never cross to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ortinf.errors import ConfigError
from ortinf.manifest import Manifest
from ortinf.providers.session import create_session
from ortinf.runtime.worker.encoder_input import EncoderInput

# Inputs per encoder call. Batching does not make the encoder cheaper per input (its cost is its
# MatMuls over 1500 positions), and past a few the [B, heads, 1500, 1500] score tensors spill the
# caches: whisper-tiny's encoder on 2 AVX-512 cores took 235, 244, 240 and 313 ms per window at
# batches of 1, 2, 4 and 10.
ENCODER_BATCH = 4


class CrossEncoder:
    """Runs the encoder of a speech-recognition (Whisper) or text2text (Marian, BART) package."""

    def __init__(self, package_dir: str | Path, manifest: Manifest, pool, found, intra_op_threads: int) -> None:
        package = Path(package_dir)
        self.pool = pool
        self.device_pool = not pool.arrays
        speech, seq2seq = manifest.speech, manifest.seq2seq
        graph, write_graph = (speech.encoder_graph, speech.encoder_write_graph) if speech else (seq2seq.encoder_graph, None)
        if self.device_pool and not write_graph:
            raise ConfigError(f"{package_dir} has no encoder graph that writes a device pool ({found.provider.name}): "
                              "re-export it with this ortinf, or run it on the cpu or openvino")
        self.session, _ = create_session(package / (write_graph if self.device_pool else graph), found, intra_op_threads, spin=False)
        self.speech = speech is not None
        self.pad = manifest.pad_token_id if manifest.pad_token_id is not None else 0
        self.num_encoded = 0  # inputs run through the encoder (the others were found in the pool)

    def feeds(self, inputs: Sequence[EncoderInput]) -> dict[str, np.ndarray]:
        """The encoder's inputs for a batch: stacked log-mel windows, or padded source ids and their mask."""
        if self.speech:
            return {"input_features": np.ascontiguousarray(np.stack([i.data for i in inputs]))}
        longest = max(len(i.data) for i in inputs)
        ids = np.full((len(inputs), longest), self.pad, dtype=np.int64)
        mask = np.zeros((len(inputs), longest), dtype=np.int64)
        for row, item in enumerate(inputs):
            ids[row, : len(item.data)] = item.data
            mask[row, : len(item.data)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def encode(self, jobs: Sequence[tuple[EncoderInput, Sequence[int]]], block_size: int) -> None:
        """Runs the encoder for each (input, its cross block ids) and writes the K/V into those blocks."""
        for first in range(0, len(jobs), ENCODER_BATCH):
            batch = jobs[first : first + ENCODER_BATCH]
            feeds = self.feeds([item for item, _ in batch])
            slots = []
            for item, blocks in batch:
                positions = np.arange(item.num_positions)
                slots.append(np.asarray(blocks, dtype=np.int64)[positions // block_size] * block_size + positions % block_size)
            if self.device_pool:
                binding = self.session.io_binding()
                for name, value in feeds.items():
                    binding.bind_cpu_input(name, value)
                binding.bind_cpu_input("slot_mapping", np.concatenate(slots))
                self.pool.bind(binding)
                self.session.run_with_iobinding(binding)
            else:
                cross = self.session.run(None, feeds)
                for row, (item, _) in enumerate(batch):
                    self.pool.write(slots[row], [layer[row, : item.num_positions] for layer in cross])
            self.num_encoded += len(batch)


__all__ = ["ENCODER_BATCH", "CrossEncoder"]
