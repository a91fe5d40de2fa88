"""The paged KV pool: its size, its memory, its binding to the graph, and how K/V get written.

One K and one V tensor per layer, allocated once where the provider computes (a numpy array wrapped without a
copy on HOST providers, an OrtValue in the provider's memory on DEVICE ones) and bound once as the graph's
`key_cache.{i}`; the step's K/V get in by the provider's `kv_write`: GRAPH_WRITE (the graph writes in place) or
HOST_WRITE (numpy writes the graph's new K/V). The last block is scratch, never handed out.

Sizing: --num-blocks, else --kv-cache-memory, else (host memory only) a share of free RAM; capped at what
max_num_seqs full-length sequences can use, and at the provider's largest tensor.

The design (the layouts, the two write paths, the measurements): docs/providers.md, "Where the pool lives"."""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
import time

import numpy as np
import onnxruntime as ort

from ortinf.config import EngineConfig, available_memory
from ortinf.errors import ConfigError
from ortinf.manifest import BLOCKS_FIRST_LAYOUT, KV_DTYPE_BYTES, DecoderSpec, cache_names, new_kv_names, pool_row
from ortinf.providers.base import GRAPH_WRITE, HOST, Provider

log = logging.getLogger(__name__)

DEFAULT_KV_FRACTION = 0.2  # of available RAM, for host pools when neither num_blocks nor kv_cache_memory is given
NUMPY_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8}


def block_bytes(spec: DecoderSpec, block_size: int) -> int:
    """Bytes of one block across all layers, keys and values."""
    return 2 * spec.num_layers * block_size * spec.num_kv_heads * pool_row(spec) * KV_DTYPE_BYTES[spec.kv_dtype]


def resolve_num_blocks(config: EngineConfig, spec: DecoderSpec, max_model_len: int, provider: Provider, cross_positions: int = 0) -> int:
    """The pool size in blocks (see the module docstring). Logs the result. `cross_positions`: the
    encoder positions an encoder-decoder's request holds cross blocks for, beside its own."""
    per_block = block_bytes(spec, config.block_size)
    one = -(-max_model_len // config.block_size) + -(-cross_positions // config.block_size)  # blocks of one whole sequence
    if config.num_blocks is not None:
        num_blocks = config.num_blocks
    else:
        memory = config.kv_cache_memory
        if memory is None:
            if provider.memory != HOST:
                raise ConfigError(f"the {provider.name} provider does not report its free memory: size the KV cache "
                                  "with --kv-cache-memory (e.g. --kv-cache-memory 2GiB; in Python kv_cache_memory= or num_blocks=)")
            memory = int(available_memory() * DEFAULT_KV_FRACTION)
        num_blocks = memory // per_block
        needed = config.max_num_seqs * one + 1
        num_blocks = min(num_blocks, needed)
    if provider.max_tensor_bytes is not None:
        per_tensor_block = per_block // (2 * spec.num_layers)
        most = provider.max_tensor_bytes // per_tensor_block - 1  # one block is scratch
        if num_blocks > most:
            log.warning("KV cache: %s computes on tensors of at most %d MiB; the pool is capped at %d blocks",
                        provider.name, provider.max_tensor_bytes // 2**20, most)
            num_blocks = most
    if num_blocks < one:
        cross = f" and its encoder's {cross_positions} positions" if cross_positions else ""
        raise ConfigError(
            f"the KV cache holds {num_blocks} blocks ({num_blocks * config.block_size} tokens), fewer than one "
            f"sequence of max_model_len {max_model_len}{cross} needs ({one}); raise kv_cache_memory/num_blocks "
            "or lower max_model_len"
        )
    log.info("KV cache: %d blocks x %d tokens = %d tokens, %.1f MiB", num_blocks, config.block_size,
             num_blocks * config.block_size, num_blocks * per_block / 2**20)
    return num_blocks


def check_context(config: EngineConfig, spec: DecoderSpec) -> int:
    """The context length the engine runs: --max-model-len, which may not exceed the package's (it was cut to it
    silently: a client then met a limit it had not asked for), else the package's."""
    if config.max_model_len is not None and config.max_model_len > spec.max_model_len:
        raise ConfigError(f"--max-model-len {config.max_model_len} is longer than this package's context ({spec.max_model_len} "
                          f"tokens, the model's position limit): pass {spec.max_model_len} or less")
    return config.max_model_len or spec.max_model_len


def check_budget(config: EngineConfig, specs: list[DecoderSpec]) -> None:
    """Before any model loads (ortinf serve runs it first): the context length (check_context), and a KV budget
    (--kv-cache-memory, --num-blocks) that cannot hold one sequence at the context length in any pool the package
    may run (`specs`: the portable graph's, the CPU kernel graph's): the error resolve_num_blocks gives at load,
    said before the server starts."""
    max_model_len = check_context(config, specs[0])
    if config.kv_cache_memory is None and config.num_blocks is None:
        return
    one = -(-max_model_len // config.block_size)
    smallest = min(block_bytes(spec, config.block_size) for spec in specs)
    num_blocks = config.num_blocks if config.num_blocks is not None else config.kv_cache_memory // smallest
    if num_blocks < one:
        raise ConfigError(f"the KV cache holds {num_blocks} blocks ({num_blocks * config.block_size} tokens), fewer than one "
                          f"sequence of max_model_len {max_model_len} needs ({one}); raise kv_cache_memory/num_blocks or lower "
                          "max_model_len")


POPULATE_NOW = 1 << 30  # a host pool up to this size is mapped before the load returns; a larger one in the background
POPULATE_CHUNK = 16 << 20  # bytes the background thread maps per call (see populate_in_background)
MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault a range in, writable, in the kernel


def reserved_zeros(shape: tuple[int, ...], dtype: np.dtype, populate: bool = True) -> np.ndarray:
    """Zeros in an anonymous mapping (np.frombuffer keeps it; freed with the array). `populate`: every page mapped now
    (MAP_POPULATE: the kernel faults them in itself, 4.5x faster than touching them from here, np.zeros + fill: 512
    MiB in 0.94 s, populated 0.20 s, on the 2-core EPYC VM where each fault is a VM exit); else mapped on first use or
    by `populate_in_background`. Where mmap has no MAP_POPULATE: np.zeros, touched now when `populate`."""
    count = int(np.prod(shape, dtype=np.int64))
    flag = getattr(mmap, "MAP_POPULATE", 0)
    if not flag or count == 0:
        array = np.zeros(shape, dtype=dtype)
        if populate:
            array.fill(0)
        return array
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (flag if populate else 0)
    return np.frombuffer(mmap.mmap(-1, count * np.dtype(dtype).itemsize, flags=flags), dtype=dtype).reshape(shape)


def populate_in_background(arrays: list[np.ndarray], what: str) -> threading.Thread:
    """Maps the arrays' pages on a daemon thread: a large pool's memory is reserved within seconds of the load, without
    the load waiting for it (the 1.5B package's default pool, 20% of the free memory, took 13.6 s to populate on a
    box whose page cache held the checkpoint: the kernel reclaimed cache as it went). madvise(MADV_POPULATE_WRITE)
    through ctypes (the GIL released while the kernel works), else a write to each page, at nice 19, since it competes
    with the first requests: the 1.5B int8 package's first 512-token TTFT right after load measured 3.8 s with the
    thread at normal priority, 2.95-3.4 s at nice 19, 2.5-2.75 s with pages left to fault as used and 2.5 s after a
    load that waited for them (load 1.1-3.0 s against 5.2-8.6 s; one noisy 2-core VM). Leaving them to fault would
    not reserve the memory: a pool the box cannot hold would fail under load, not at start.
    The thread holds the arrays: a pool freed meanwhile is unmapped when it is done.
    In POPULATE_CHUNK pieces: a populating call holds the process's mmap lock, and every large allocation of the
    engine's own thread (numpy's step arrays are mmapped: 16 rows of a 152K vocabulary's logits are 9.7 MB) waits
    for it; one call per 82 MB layer tensor made a 1.5B int8 batch of 16 run at 23 tok/s for as long as the thread
    ran (np.stack of the logits 48 ms a call) against 41 tok/s once it was done (issue 57)."""
    def run() -> None:
        started = time.perf_counter()
        try:  # the lowest priority: the kernel's work here is this thread's, and requests come first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):
            pass
        madvise = _libc_madvise()
        for array in arrays:
            for start in range(0, array.nbytes, POPULATE_CHUNK):
                size = min(POPULATE_CHUNK, array.nbytes - start)
                if madvise is None or madvise(ctypes.c_void_p(array.ctypes.data + start), ctypes.c_size_t(size), MADV_POPULATE_WRITE) != 0:
                    array.reshape(-1).view(np.uint8)[start:start + size:mmap.PAGESIZE] = 0
        log.debug("%s: %.2f GB of KV pool mapped in %.1f s", what, sum(a.nbytes for a in arrays) / 1e9, time.perf_counter() - started)

    thread = threading.Thread(target=run, name="ortinf-kv-populate", daemon=True)
    thread.start()
    return thread


def _libc_madvise():  # a ctypes function or None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


class KVPool:
    """The pool of one decoder session: allocated at construction, bound with `bind`."""

    def __init__(self, spec: DecoderSpec, num_blocks: int, block_size: int, provider: Provider) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_slot = num_blocks * block_size  # first slot of the scratch block
        self.blocks_first = spec.kv_layout == BLOCKS_FIRST_LAYOUT  # the contrib kernel's layout
        if self.blocks_first:
            self.shape = (num_blocks + 1, block_size, spec.num_kv_heads, spec.head_dim)
        else:
            self.shape = (spec.num_kv_heads, num_blocks + 1, block_size, pool_row(spec))
        dtype = NUMPY_DTYPES[spec.kv_dtype]
        self.input_names, self.output_names = cache_names(spec.num_layers)
        self.graph_write = provider.kv_write == GRAPH_WRITE or self.blocks_first  # the contrib op always writes
        if not self.graph_write:
            assert provider.memory == HOST, "the numpy write needs a host pool"
            self.output_names = new_kv_names(spec.num_layers)
        self.arrays: list[np.ndarray] = []  # host pools only
        self.values: list[ort.OrtValue] = []
        now = len(self.input_names) * int(np.prod(self.shape, dtype=np.int64)) * np.dtype(dtype).itemsize <= POPULATE_NOW
        self.populating: threading.Thread | None = None
        for _ in self.input_names:
            if provider.memory == HOST:
                array = reserved_zeros(self.shape, dtype, populate=now)
                self.arrays.append(array)
                self.values.append(ort.OrtValue.ortvalue_from_numpy(array))
            else:
                value = ort.OrtValue.ortvalue_from_shape_and_type(self.shape, dtype, provider.device_type, 0)
                value.update_inplace(np.zeros(self.shape, dtype=dtype))  # device memory starts as garbage (NaN * 0 = NaN)
                self.values.append(value)
        if self.arrays and not now:
            self.populating = populate_in_background(list(self.arrays), f"{num_blocks} blocks of {block_size}")

    def wait_until_resident(self) -> None:
        """Returns once every page of the pool is mapped (at once unless it is mapped in the background)."""
        if self.populating is not None:
            self.populating.join()

    def bind(self, binding: ort.IOBinding) -> None:
        """Binds every tensor as the graph's pool input and, with the graph write, as the output the
        graph writes it to (with the host write, the new K/V outputs come back to host memory)."""
        for name_in, name_out, value in zip(self.input_names, self.output_names, self.values):
            binding.bind_ortvalue_input(name_in, value)
            if self.graph_write:
                binding.bind_ortvalue_output(name_out, value)
            else:
                binding.bind_output(name_out, "cpu")

    def write(self, slot_mapping: np.ndarray, new_kv: list[ort.OrtValue | np.ndarray]) -> None:
        """The host write: each layer's new K/V ([num_tokens, kv_heads, head_dim]) into their slots
        (also how an encoder-decoder's cross-attention K/V reach their blocks)."""
        kv_heads, head_dim = self.shape[0], self.shape[3]
        for array, value in zip(self.arrays, new_kv):
            values = value.numpy() if isinstance(value, ort.OrtValue) else np.asarray(value)
            array.reshape(kv_heads, -1, head_dim)[:, slot_mapping] = values.swapaxes(0, 1)

    def read(self, index: int) -> np.ndarray:
        """A host copy of tensor `index` (K of layer i is 2i, V is 2i + 1), without the scratch block."""
        array = self.values[index].numpy()
        return array[: self.num_blocks] if self.blocks_first else array[:, : self.num_blocks]
