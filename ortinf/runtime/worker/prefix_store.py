"""PrefixStore: the prefix cache's full blocks on disk (`--prefix-cache-dir`), so that a restart, or a second replica
on the same disk, finds the K/V of a long prompt it has seen instead of prefilling it again.

Keys. A block's key chains over the prompt as the in-memory cache's hashes do, but stably across processes (SHA-256,
not Python's salted hash): the root covers the package's identity (its manifest and graph files, the pool's shape and
dtype, the block size) and the request's cache salt (its images' and encoder input's digests, the client's
cache_salt); each block's key covers its parent's and its tokens. Requests with a LoRA adapter are not stored (an
adapter's identity does not survive a restart).

Files. DIR/<identity>/<key[:2]>/<key>.kv: a header (magic and version, payload length, CRC-32 of the payload) and the
block's rows of every layer's K and V, as the pool holds them (any pool dtype: fp32, fp16, int8 rows with their
scales). A file is written to a temporary name and renamed: a crash mid-write leaves no file under a key, and a file
whose length or checksum is wrong is deleted with a warning and treated as a miss. Writes run on a thread of their own
(the block's bytes are copied off the pool on the engine thread first, so the pool may be reused at once); when the
folder passes --prefix-cache-disk the least recently used files go.

Restoring. On a prefix miss the KV cache manager asks for the request's next blocks here before it prefills:
each found is read into a free block, which is then cached like a block the engine computed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"ORTKV\x01"
HEADER = struct.Struct("<6sQI")  # magic, payload bytes, CRC-32 of the payload
WRITE_QUEUE = 256  # blocks waiting for the writer; past that a block is not stored (it is a cache)


def package_identity(package_dir: Path, pool_shape: Sequence[int], dtype: str, block_size: int, graph: str) -> str:
    """What a stored block's K/V depend on besides its tokens: the package (manifest and graph files: names, sizes,
    modification times), the graph the engine runs and its pool's layout."""
    digest = hashlib.sha256()
    digest.update((Path(package_dir) / "ortinf.json").read_bytes())
    for path in sorted(Path(package_dir).glob("*.onnx*")):
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}".encode())
    digest.update(f"{graph}|{tuple(pool_shape)}|{dtype}|{block_size}".encode())
    return digest.hexdigest()[:32]


def open_store(config, graph, encoder_decoder: bool) -> PrefixStore:  # noqa: ANN001 - an EngineConfig, a DecoderGraph
    """An engine's store (--prefix-cache-dir), or a ConfigError that says why its package or provider cannot have one."""
    from ortinf.errors import ConfigError

    pool = graph.pool
    if not config.enable_prefix_caching:
        raise ConfigError("--prefix-cache-dir stores the prefix cache: drop --no-enable-prefix-caching")
    if encoder_decoder:
        raise ConfigError("--prefix-cache-dir is for text-generation packages, not encoder-decoders")
    if not pool.arrays:
        raise ConfigError(f"--prefix-cache-dir needs the KV pool in host memory; the {graph.provider.name} provider keeps it on the "
                          "device: run on the CPU (or OpenVINO), or drop --prefix-cache-dir")
    identity = package_identity(config.package_dir, pool.shape, str(pool.arrays[0].dtype), config.block_size,
                                f"{graph.provider.name}/{graph.kernel_description}")
    return PrefixStore(config.prefix_cache_dir, identity, config.prefix_cache_disk, pool.arrays, pool.blocks_first)


def chain(identity: str, salt: str | None, blocks: Sequence[Sequence[int]]) -> list[str]:
    """The stable key of each of a prompt's full blocks (`blocks`: their token ids, in order)."""
    parent = hashlib.sha256(f"{identity}|{salt or ''}".encode()).digest()
    keys = []
    for tokens in blocks:
        parent = hashlib.sha256(parent + np.asarray(tokens, dtype=np.int64).tobytes()).digest()
        keys.append(parent.hex())
    return keys


class PrefixStore:
    """Blocks of a host KV pool kept on disk under a byte budget."""

    def __init__(self, folder: str | Path, identity: str, limit: int, arrays: list[np.ndarray], blocks_first: bool) -> None:
        self.root = Path(folder) / identity
        self.root.mkdir(parents=True, exist_ok=True)
        self.identity, self.limit, self.arrays, self.blocks_first = identity, limit, arrays, blocks_first
        self.block_nbytes = sum(self._view(array, 0).nbytes for array in arrays)
        self._pieces: list[tuple] | None = None  # the pool's pieces of a block (made on the first restore)
        self.index: OrderedDict[str, int] = OrderedDict()  # key -> file bytes, least recently used first
        self.lock = threading.Lock()
        self.num_written = self.num_restored = self.num_rejected = 0
        files = sorted(self.root.glob("*/*.kv"), key=lambda p: p.stat().st_mtime)
        for path in files:
            self.index[path.stem] = path.stat().st_size
        for stale in self.root.glob("*/*.tmp*"):  # a write a crash cut short
            stale.unlink(missing_ok=True)
        self.bytes = sum(self.index.values())
        self.writes: queue.Queue = queue.Queue(WRITE_QUEUE)
        self.writer = threading.Thread(target=self._write_loop, name="ortinf-prefix-store", daemon=True)
        self.writer.start()

    def _view(self, array: np.ndarray, block_id: int) -> np.ndarray:
        return array[block_id] if self.blocks_first else array[:, block_id]

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.kv"

    def has(self, key: str) -> bool:
        with self.lock:
            return key in self.index

    # -- writing (the engine thread copies; the writer thread writes) -----------------------------------

    def save(self, key: str, block_id: int) -> None:
        """Stores a full block's K/V under `key` (no-op when stored already or the writer is behind)."""
        with self.lock:
            if key in self.index:
                self.index.move_to_end(key)
                return
        payload = b"".join(np.ascontiguousarray(self._view(array, block_id)).tobytes() for array in self.arrays)
        try:
            self.writes.put_nowait((key, payload))
        except queue.Full:
            pass

    def _write_loop(self) -> None:
        while True:
            item = self.writes.get()
            if item is None:
                return
            key, payload = item
            try:
                self._write(key, payload)
            except OSError as exc:
                log.warning("the prefix cache could not write a block to %s: %s", self.root, exc)
            finally:
                self.writes.task_done()

    def _write(self, key: str, payload: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(exist_ok=True)
        temporary = path.with_suffix(f".tmp{threading.get_ident()}")
        with open(temporary, "wb") as out:
            out.write(HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)))
            out.write(payload)
        os.replace(temporary, path)  # atomic: a reader sees the whole file or none
        size = HEADER.size + len(payload)
        with self.lock:
            if key not in self.index:
                self.index[key] = size
                self.bytes += size
                self.num_written += 1
            evicted = []
            while self.bytes > self.limit and len(self.index) > 1:
                old, old_size = self.index.popitem(last=False)
                self.bytes -= old_size
                evicted.append(old)
        for old in evicted:
            self._path(old).unlink(missing_ok=True)

    def flush(self) -> None:
        """Waits until every queued block is on disk."""
        self.writes.join()

    def close(self) -> None:
        self.flush()
        self.writes.put(None)

    # -- restoring (the engine thread) -----------------------------------------------------------------

    def load(self, key: str, block_id: int) -> bool:
        """Reads a stored block into the pool's block `block_id`; False (and the file gone, with a warning) when it is
        missing, truncated or corrupt."""
        return self.load_many([key], [block_id]) == 1

    def load_many(self, keys: Sequence[str], block_ids: Sequence[int]) -> int:
        """Reads stored blocks, in order, into the pool's blocks `block_ids`, until one is missing, truncated or corrupt
        (that file is deleted, with a warning); returns how many were read. Each file is read straight into its
        block's rows in the pool, one scatter read (readv) per file: no intermediate buffer (a fresh one faulted in
        49 MB of pages for a 4,000-token prompt, and the copies out of it cost as much again), and the checksum is
        taken over the rows it filled. A block that fails its check is left uncached (its rows are garbage nobody reads)."""
        count = 0
        for key, block_id in zip(keys, block_ids):
            if not self._read_into(key, block_id):
                break
            count += 1
        with self.lock:
            for key in keys[:count]:
                if key in self.index:
                    self.index.move_to_end(key)
        for key in keys[:count]:
            try:
                os.utime(self._path(key))  # its place in the eviction order survives a restart
            except OSError:
                pass
        self.num_restored += count
        return count

    def _rows(self, block_id: int) -> list[memoryview]:
        """The pool's memory of block `block_id`, as contiguous pieces in the order a stored block holds them: slices of
        each tensor's bytes (a numpy view per piece cost 40 ms for a 4,000-token prompt; a slice costs nothing)."""
        if self._pieces is None:  # (a tensor's bytes, where its piece of block 0 starts, the piece's size): one per head
            self._pieces = []
            for array in self.arrays:
                flat = memoryview(array.reshape(-1).view(np.uint8))
                if self.blocks_first:  # [blocks, block_size, heads, dim]: the block is one piece
                    self._pieces.append((flat, 0, array[0].nbytes))
                else:  # [heads, blocks, block_size, row]
                    self._pieces += [(flat, h * array[0].nbytes, array[0, 0].nbytes) for h in range(array.shape[0])]
        return [flat[base + block_id * size : base + (block_id + 1) * size] for flat, base, size in self._pieces]

    def _read_into(self, key: str, block_id: int) -> bool:
        path = self._path(key)
        header = bytearray(HEADER.size)
        rows = self._rows(block_id)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            self._forget(key)
            return False
        try:
            got = os.readv(fd, [header, *rows])
            extra = os.read(fd, 1)
        except OSError:
            got, extra = -1, b""
        finally:
            os.close(fd)
        problem = None
        if got < HEADER.size + self.block_nbytes or extra:
            problem = "truncated" if got < HEADER.size + self.block_nbytes else "not a block of this pool"
        else:
            magic, length, crc = HEADER.unpack_from(header)
            if magic != MAGIC or length != self.block_nbytes:
                problem = "not a block of this pool"
            else:
                found = 0
                for row in rows:
                    found = zlib.crc32(row, found)
                if found != crc:
                    problem = "its checksum does not match"
        if problem is not None:
            log.warning("prefix cache: ignoring %s (%s)", path, problem)
            self.num_rejected += 1
            self._forget(key)
            path.unlink(missing_ok=True)
            return False
        return True

    def _forget(self, key: str) -> None:
        with self.lock:
            size = self.index.pop(key, None)
            if size is not None:
                self.bytes -= size


__all__ = ["PrefixStore", "chain", "open_store", "package_identity"]
