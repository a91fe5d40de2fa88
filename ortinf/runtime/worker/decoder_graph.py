"""DecoderGraph: an exported decoder package on one provider, with its bound KV pool.

The session is created on the provider (ortinf/providers/session.py proves where its nodes run) over the
package graph that suits its KV write (model.onnx writes K/V itself; model.host-write.onnx returns
them for numpy), the pool is allocated where the provider computes and bound once
(ortinf/runtime/worker/kv_pool.py), and each call binds
only the step's small inputs (copied into reused host buffers) and fetches only the logits rows
the step asked for. On providers that compile per input shape (or with shape_buckets), the step is
padded to shape buckets (ortinf/runtime/worker/model_input.py, pad_to_buckets).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ortinf.config import available_memory
from ortinf.errors import ConfigError
from ortinf.kernels import library
from ortinf.manifest import (
    ATTEND_UNTIL,
    CONTRIB_PAGED,
    HOST_WRITE_MODEL_NAME,
    KV_LAYOUTS,
    LOGITS,
    LORA_MASK,
    MODEL_NAME,
    MROPE_DELTAS,
    SLOT_MAPPING,
    DecoderSpec,
    Manifest,
    check_block_size,
)
from ortinf.providers.base import GRAPH_WRITE, POWER_OF_TWO_BUCKETS
from ortinf.providers.registry import PROVIDERS, Found, resolve
from ortinf.providers.session import create_session
from ortinf.runtime.worker.kv_pool import KVPool
from ortinf.runtime.worker.lora import LoraSlots
from ortinf.runtime.worker.model_input import ModelInput, pad_to_buckets

log = logging.getLogger(__name__)


def cpu_kernels(manifest: Manifest, package_dir: str | Path, provider: str, wanted: bool | None) -> library.KernelLibrary | None:
    """The kernel library when a session on `provider` runs the package's CPU-kernel graph, else None
    (`wanted`: DecoderGraph's cpu_kernel)."""
    if wanted is False or provider != "cpu":
        return None
    if manifest.cpu_kernel is None:
        if wanted:
            raise ConfigError(f"{package_dir} has no graph for ortinf's CPU kernel library: re-export it with this ortinf")
        return None
    loaded = library.load()
    if loaded is None and wanted:
        raise ConfigError(f"{package_dir}'s CPU graph needs ortinf's kernel library, which is not loaded here: "
                          "build it with `python -m ortinf.kernels.build`")
    return loaded


def pool_spec(manifest: Manifest, kernels: library.KernelLibrary | None) -> DecoderSpec:
    """The decoder spec whose kv_dtype is the pool's: the CPU-kernel graph's own (an int8 pool) when it runs."""
    spec = manifest.decoder
    if kernels is not None and manifest.cpu_kernel.kv_dtype:
        return replace(spec, kv_dtype=manifest.cpu_kernel.kv_dtype)
    return spec


WIDENED_SHARE = 0.6  # of the memory available now, what a bf16 package's weights may take once widened to fp32


def fits_widened(manifest: Manifest, package_dir: Path) -> bool:
    """Whether the portable graph may widen a bf16 package's weights to fp32 at load (ORT folds each weight's Cast):
    twice the weight file's bytes within WIDENED_SHARE of the available memory. Otherwise the Casts run per call
    (one weight widened at a time, slower steps), with a warning: a 7B bf16 package is 15 GB, 30 GB widened."""
    if manifest.dtype != "bf16":
        return True
    weights = sum(p.stat().st_size for p in package_dir.glob("*.onnx.data"))
    if 2 * weights <= WIDENED_SHARE * available_memory():
        return True
    log.warning("%s: its bf16 weights widened to fp32 (%.1f GiB) would not fit in memory: the portable graph widens them "
                "per step instead (slower); ortinf's CPU kernel graph reads bf16 as it is (python -m ortinf.kernels.build)",
                package_dir.name, 2 * weights / 2**30)
    return False


class DecoderGraph:
    """The decoder graph of a package with a KV pool of `num_blocks` blocks of `block_size` tokens."""

    def __init__(
        self,
        package_dir: str | Path,
        num_blocks: int,
        block_size: int = 16,
        provider: str | Found = "auto",
        intra_op_threads: int = 0,
        provider_options: dict[str, str] | None = None,
        allow_cpu_fallback: bool = False,
        shape_buckets: bool | None = None,
        cpu_kernel: bool | None = None,
        profile_prefix: str | None = None,
        spin: bool = True,
        bf16_math: str = "bf16",
    ) -> None:
        """`cpu_kernel`: run the package's graph for ortinf's CPU kernel library (model.cpu.onnx) on
        the CPU provider: None = when the package has it and the library loads, else the portable
        graph; True = required (ConfigError otherwise); False = never.
        `spin`: let the session's threads spin between calls (the engine's decoder); False for a
        session that shares the cores with one that does (a draft model; ortinf/providers/session.py).
        `bf16_math`: a bf16 package's matrix products on the kernel library, "bf16" or "fp32" (EngineConfig.bf16_math)."""
        self.manifest = Manifest.load(package_dir)
        if self.manifest.decoder is None:  # a text decoder, or an encoder-decoder's (Whisper) decoder
            raise ConfigError(f"{package_dir} holds a {self.manifest.task} model, not a text-generation decoder")
        self.spec: DecoderSpec = self.manifest.decoder
        if self.spec.kernel not in KV_LAYOUTS or self.spec.kv_layout != KV_LAYOUTS[self.spec.kernel]:
            raise ConfigError(f"{package_dir} uses another kernel or KV layout; re-export it with this ortinf")
        self.found = resolve(provider) if isinstance(provider, str) else provider
        self.provider = self.found.provider
        if self.spec.kernel not in self.provider.kernels:
            runs = ", ".join(name for name, p in PROVIDERS.items() if self.spec.kernel in p.kernels)
            raise ConfigError(f"{package_dir} was exported with the {self.spec.kernel} kernel, which runs on {runs}, not on "
                              f"{self.provider.name}: choose one of those or re-export with --kernel portable")
        if self.manifest.dtype not in self.provider.dtypes:
            raise ConfigError(f"{package_dir} is {self.manifest.dtype}; the {self.provider.name} provider runs "
                              f"{', '.join(self.provider.dtypes)}: re-export with --dtype {self.provider.dtypes[0]}")
        self.contrib = self.spec.kernel == CONTRIB_PAGED
        check_block_size(self.spec.kernel, block_size)
        self.max_query_len = self.provider.max_query_len.get(self.spec.kernel)  # the scheduler chunks prefills to it
        graph_file = MODEL_NAME if self.provider.kv_write == GRAPH_WRITE or self.contrib else HOST_WRITE_MODEL_NAME
        kernels = cpu_kernels(self.manifest, package_dir, self.provider.name, cpu_kernel) if graph_file == MODEL_NAME else None
        if kernels is not None:
            graph_file = self.manifest.cpu_kernel.graph
            self.spec = pool_spec(self.manifest, kernels)
        #: which attention kernel this session runs, in words (`ortinf inspect`, logs)
        self.kernel_description = (f"{library.DOMAIN}.{'/'.join(self.manifest.cpu_kernel.ops)} ({kernels.isa})"
                                   if kernels is not None else self.spec.kernel)
        self.session, self.placement = create_session(
            Path(package_dir) / graph_file, self.found, intra_op_threads, provider_options, allow_cpu_fallback,
            kernels.path if kernels is not None else None, profile_prefix, spin,
            fold_constants=kernels is not None or fits_widened(self.manifest, Path(package_dir)), bf16_math=bf16_math)
        self.block_size = block_size
        self.pool = KVPool(self.spec, num_blocks, block_size, self.provider)
        self.binding = self.session.io_binding()
        self.binding.bind_output(LOGITS, "cpu")  # first bound output: get_outputs()[0]
        self.pool.bind(self.binding)
        self._buffers: dict[str, np.ndarray] = {}
        # The step binds through ORT's C binding under its Python IOBinding: the wrapper makes an OrtDevice per bind
        # and a Python OrtValue per bound output (the pool's two per layer too) on every call: 55 us of each step at
        # 24 layers (45 of them in get_outputs), a tenth of what a one-token step spends outside the graph.
        self._raw = self.binding._iobinding
        self._host = ort.OrtDevice.make("cpu", 0)._get_c_device()
        self._lora: LoraSlots | None = None
        if self.spec.lora_targets:  # no adapter slot until the engine sets some: one zero column
            self.lora = LoraSlots(self.spec, dtype=self.lora_dtype)
        if shape_buckets is None:
            self.buckets = self.provider.buckets
        else:
            self.buckets = (self.provider.buckets or POWER_OF_TWO_BUCKETS) if shape_buckets else None

    @property
    def lora(self) -> LoraSlots | None:
        """The loaded LoRA adapters (ortinf/runtime/worker/lora.py) of a package with LoRA inputs."""
        return self._lora

    @lora.setter
    def lora(self, slots: LoraSlots) -> None:
        """Binds the adapters' A/B inputs once, where they live (loading writes them in place)."""
        self._lora = slots
        for name, array in slots.weights().items():
            self.binding.bind_input(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)

    @property
    def lora_dtype(self) -> type:
        return np.float16 if self.manifest.dtype == "fp16" else np.float32

    def run(self, model_input: ModelInput) -> np.ndarray:
        """Runs one step; returns logits [rows, vocab]. The graph writes the new K/V into the pool."""
        rows = len(model_input.logits_indices)
        if self.max_query_len and int(model_input.query_lens.max()) > self.max_query_len:
            raise ConfigError(f"{self.provider.name} runs the {self.spec.kernel} kernel on at most {self.max_query_len} new tokens "
                              "per sequence per call: chunk the prefill")
        if self.buckets is not None:
            model_input = pad_to_buckets(model_input, self.buckets, self.pool.scratch_slot, self.block_size)
        feeds = model_input.feeds()
        if self.spec.mrope_section and MROPE_DELTAS not in feeds:  # text-only steps: every component is the position
            feeds[MROPE_DELTAS] = np.zeros((3, len(model_input.input_ids)), np.int64)
        if self.spec.image_spans and ATTEND_UNTIL not in feeds:  # no image: causal
            feeds[ATTEND_UNTIL] = model_input.positions
        if self.contrib:  # the op writes the new tokens through the block table, and derives their slots
            feeds["block_tables"] = model_input.full_block_tables
            del feeds[SLOT_MAPPING]
        elif not self.pool.graph_write:
            del feeds[SLOT_MAPPING]
        for name, array in feeds.items():
            self._bind_input(name, array)
        if self._lora is not None:  # the A/B inputs stay bound (the lora setter); the mask is per step
            slots = model_input.lora_slots if model_input.lora_slots is not None else np.full(len(model_input.input_ids), -1)
            self._bind_input(LORA_MASK, self._lora.mask(slots))
        self._raw.bind_output(LOGITS, self._host)  # unallocated again: its row count changes per step
        if not self.pool.graph_write:
            for name in self.pool.output_names:
                self._raw.bind_output(name, self._host)
        self.session.run_with_iobinding(self.binding)
        outputs = self._raw.get_outputs()  # the C vector: an output is wrapped only when read
        if not self.pool.graph_write:
            self.pool.write(model_input.slot_mapping, [outputs[i].numpy() for i in range(1, len(outputs))])
        return outputs[0].numpy()[:rows]

    def _bind_input(self, name: str, array: np.ndarray) -> None:
        """Copies a small input into its reused host buffer (grown when too small) and binds a view."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < array.size:
            buffer = self._buffers[name] = np.empty(max(array.size * 2, 64), dtype=array.dtype)
        view = buffer[: array.size].reshape(array.shape)
        view[...] = array
        self._raw.bind_input(name, self._host, view.dtype, list(view.shape), view.ctypes.data)

    def read_pool(self, index: int) -> np.ndarray:
        """A host copy of pool tensor `index` (K of layer i is 2i, V is 2i + 1)."""
        return self.pool.read(index)

