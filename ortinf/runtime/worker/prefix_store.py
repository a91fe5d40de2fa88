"""PrefixStore: the prefix cache's full blocks on disk (`--prefix-cache-dir`), so that a restart, or a second server
on the same folder, finds the K/V of a long prompt it has seen instead of prefilling it again.

A block's key is a SHA-256 chain over the prompt, rooted at the package's identity and the request's cache salt.
Files (DIR/<identity>/<key[:2]>/<key>.kv: a checksummed header and the block's rows of every layer's K and V) are
written on a thread of their own under a temporary name and renamed; the budget (--prefix-cache-disk) bounds the
whole folder in one least-recently-used order. The folder is not trusted: any bad file or disk error is a miss.
On a prefix miss the KV cache manager asks here for the request's next blocks before it prefills.

The design (keys, files, budget, sharing a folder, trust): docs/server.md, "--prefix-cache-dir"."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import queue
import re
import stat
import struct
import threading
import time
import zlib
from collections import Counter, OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"ORTKV\x01"
HEADER = struct.Struct("<6sQI")  # magic, payload bytes, CRC-32 of the payload
WRITE_QUEUE = 256  # blocks waiting for the writer; past that a block is not stored (it is a cache)
TEMP_AGE = 600.0  # seconds: an older temporary file is a write a crash cut short (a younger one: another server's, mid-write)
RESCAN_SECONDS = 30.0  # how often the writer re-reads the folder while it writes (the other servers' blocks)
WARN_SECONDS = 60.0  # one disk warning per this many seconds; the rest are counted in the next one
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)  # a FIFO must not block
IDENTITY_NAME, SUBFOLDER_NAME = re.compile("[0-9a-f]{32}"), re.compile("[0-9a-f]{2}")
BLOCK_NAME, TEMP_NAME = re.compile(r"[0-9a-f]{64}\.kv"), re.compile(r"[0-9a-f]{64}\.tmp\d+-\d+")
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def block_shape(shape: Sequence[int], blocks_first: bool) -> tuple[int, ...]:
    """A pool tensor's shape without its block count: the shape of one block's piece of it."""
    return tuple(shape[1:]) if blocks_first else (shape[0], *shape[2:])


def package_identity(package_dir: Path, block: Sequence[int], num_tensors: int, dtype: str, block_size: int, graph: str) -> str:
    """What a stored block's K/V depend on besides its tokens: the package (manifest and graph files: names, sizes,
    modification times), the graph the engine runs (provider, kernel, instruction set) and a block's layout in the
    pool (`block`: one tensor's piece of one block, `num_tensors` of them). The pool's block count is not part of it."""
    digest = hashlib.sha256()
    digest.update((Path(package_dir) / "ortinf.json").read_bytes())
    for path in sorted(Path(package_dir).glob("*.onnx*")):
        info = path.stat()
        digest.update(f"{path.name}:{info.st_size}:{int(info.st_mtime)}".encode())
    digest.update(f"{graph}|{tuple(block)}x{num_tensors}|{dtype}|{block_size}".encode())
    return digest.hexdigest()[:32]


def open_store(config, graph, encoder_decoder: bool) -> PrefixStore:  # an EngineConfig, a DecoderGraph
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
    identity = package_identity(config.package_dir, block_shape(pool.shape, pool.blocks_first), len(pool.arrays),
                                str(pool.arrays[0].dtype), config.block_size, f"{graph.provider.name}/{graph.kernel_description}")
    return PrefixStore(config.prefix_cache_dir, identity, config.prefix_cache_disk, pool.arrays, pool.blocks_first)


def chain(identity: str, salt: str | None, blocks: Sequence[Sequence[int]]) -> list[str]:
    """The stable key of each of a prompt's full blocks (`blocks`: their token ids, in order)."""
    parent = hashlib.sha256(f"{identity}|{salt or ''}".encode()).digest()
    keys = []
    for tokens in blocks:
        parent = hashlib.sha256(parent + np.asarray(tokens, dtype=np.int64).tobytes()).digest()
        keys.append(parent.hex())
    return keys


def scan(folder: Path, keep: str) -> list[tuple[float, str, str, int]]:
    """(modification time, identity, key, bytes) of every block file in the folder, oldest first; removes temporary
    files older than TEMP_AGE and identity folders left empty but `keep`'s. Only names this module writes are read or
    removed (DIR may be a folder with other things in it); regular files only; whatever cannot be read is skipped, and
    whatever cannot be removed stays (a read-only folder)."""
    found, now = [], time.time()
    for identity in _entries(folder, IDENTITY_NAME):
        count = 0
        for sub in _entries(identity.path, SUBFOLDER_NAME):
            for entry in _entries(sub.path, None):
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if BLOCK_NAME.fullmatch(entry.name) and stat.S_ISREG(info.st_mode):
                    found.append((info.st_mtime, identity.name, entry.name[:-3], info.st_size))
                    count += 1
                elif TEMP_NAME.fullmatch(entry.name) and now - info.st_mtime > TEMP_AGE:
                    _remove(entry.path)
        if count == 0 and identity.name != keep:  # a stale identity's last block went: its folder goes too (rmdir: only if empty)
            for sub in _entries(identity.path, SUBFOLDER_NAME):
                _remove(sub.path, folder=True)
            _remove(identity.path, folder=True)
    found.sort()
    return found


def _entries(folder: str | Path, directories: re.Pattern | None) -> list[os.DirEntry]:
    """The folder's subfolders whose names match `directories` (links are not followed), or its other entries (None)."""
    try:
        with os.scandir(folder) as it:
            if directories is None:
                return [e for e in it if not e.is_dir(follow_symlinks=False)]
            return [e for e in it if e.is_dir(follow_symlinks=False) and directories.fullmatch(e.name)]
    except OSError:
        return []


def _remove(path: str | Path, folder: bool = False) -> bool:
    try:
        (os.rmdir if folder else os.unlink)(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


class PrefixStore:
    """Blocks of a host KV pool kept on disk, the whole folder under a byte budget."""

    def __init__(self, folder: str | Path, identity: str, limit: int, arrays: list[np.ndarray], blocks_first: bool) -> None:
        self.folder = Path(folder)
        self.root = self.folder / identity
        self.identity, self.limit, self.arrays, self.blocks_first = identity, limit, arrays, blocks_first
        self.block_nbytes = sum(self._view(array, 0).nbytes for array in arrays)
        self.file_nbytes = HEADER.size + self.block_nbytes
        self._pieces: list[tuple] | None = None  # the pool's pieces of a block (made on the first restore)
        self.lock = threading.Lock()
        self.index: OrderedDict[tuple[str, str], int] = OrderedDict()  # (identity, key) -> bytes, least recently used first
        self.per_identity: Counter[str] = Counter()
        self.bytes = 0
        self.num_written = self.num_restored = self.num_rejected = self.num_evicted = 0
        self._quiet_until, self._unreported = 0.0, 0
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a read-only or missing disk: every block a miss, the server still starts
            self._warn("cannot create %s (%s): blocks are neither stored nor restored", self.root, exc)
        self._load_index()
        self._last_scan = time.monotonic()
        log.info("prefix cache on disk: %d blocks of this package, %d blocks (%d bytes) in all in %s (budget %d bytes)",
                 self.per_identity[identity], len(self.index), self.bytes, self.folder, self.limit)
        self.writes: queue.Queue = queue.Queue(WRITE_QUEUE)
        self.writes.put(())  # first, a folder above the budget (a smaller --prefix-cache-disk, other packages') shrinks
        self.writer = threading.Thread(target=self._write_loop, name="ortinf-prefix-store", daemon=True)
        self.writer.start()

    def _view(self, array: np.ndarray, block_id: int) -> np.ndarray:
        return array[block_id] if self.blocks_first else array[:, block_id]

    def _path(self, key: str, identity: str | None = None) -> Path:
        return self.folder / (identity or self.identity) / key[:2] / f"{key}.kv"

    def _load_index(self) -> None:
        """The index from the folder as it is now (the files' modification times are the LRU order)."""
        found = scan(self.folder, self.identity)
        with self.lock:
            self.index = OrderedDict(((identity, key), size) for _, identity, key, size in found)
            self.per_identity = Counter(identity for _, identity, _, _ in found)
            self.bytes = sum(self.index.values())

    def stats(self) -> tuple[int, int, int, int]:
        """(blocks restored, written, evicted, bytes on disk) since the start, for the metrics."""
        return self.num_restored, self.num_written, self.num_evicted, self.bytes

    def _warn(self, message: str, *args: object) -> None:
        """A disk problem, logged at most once per WARN_SECONDS (a full disk fails every write)."""
        now = time.monotonic()
        with self.lock:
            if now < self._quiet_until:
                self._unreported += 1
                return
            self._quiet_until, unreported, self._unreported = now + WARN_SECONDS, self._unreported, 0
        suffix = f" ({unreported} more disk problems since the last warning)" if unreported else ""
        log.warning("prefix cache: " + message + suffix, *args)

    def has(self, key: str) -> bool:
        """Whether the block is stored: in the index, or (another server's, written since this one read the folder) as a
        regular file of a block's size in the folder, which then joins the index."""
        entry = (self.identity, key)
        with self.lock:
            if entry in self.index:
                return True
        try:
            info = os.stat(self._path(key), follow_symlinks=False)
        except OSError:
            return False
        if not stat.S_ISREG(info.st_mode) or info.st_size != self.file_nbytes:
            return False
        with self.lock:
            self._add(entry, info.st_size)
        return True

    def _add(self, entry: tuple[str, str], size: int) -> bool:  # (holding the lock)
        if entry in self.index:
            self.index.move_to_end(entry)
            return False
        self.index[entry] = size
        self.per_identity[entry[0]] += 1
        self.bytes += size
        return True

    def _drop(self, entry: tuple[str, str]) -> int | None:  # (holding the lock)
        size = self.index.pop(entry, None)
        if size is not None:
            self.bytes -= size
            self.per_identity[entry[0]] -= 1
        return size

    # -- writing (the engine thread copies; the writer thread writes) -----------------------------------

    def save(self, key: str, block_id: int) -> None:
        """Stores a full block's K/V under `key` (no-op when stored already or the writer is behind)."""
        with self.lock:
            if (self.identity, key) in self.index:
                self.index.move_to_end((self.identity, key))
                return
        payload = b"".join(np.ascontiguousarray(self._view(array, block_id)).tobytes() for array in self.arrays)
        try:
            self.writes.put_nowait((key, payload))
        except queue.Full:
            pass

    def _write_loop(self) -> None:
        while True:
            item = self.writes.get()
            try:
                if item is None:
                    return
                if time.monotonic() - self._last_scan > RESCAN_SECONDS:
                    self._last_scan = time.monotonic()
                    self._load_index()
                if item:
                    self._write(*item)
                self._evict()
            except Exception as exc:  # noqa: BLE001 - a cache: a failed write is a block not stored, never a dead writer
                self._warn("could not write a block to %s (%s): it is not stored", self.root, exc)
            finally:
                self.writes.task_done()

    def _write(self, key: str, payload: bytes) -> None:
        path = self._path(key)
        temporary = path.with_name(f"{key}.tmp{os.getpid()}-{threading.get_ident()}")  # unique per process and thread
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(temporary, WRITE_FLAGS, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)))
                out.write(payload)
            os.replace(temporary, path)  # atomic: a reader sees the whole file or none
        except BaseException:
            _remove(temporary)  # a full disk: no empty temporary file per failed write
            raise
        with self.lock:
            if self._add((self.identity, key), HEADER.size + len(payload)):
                self.num_written += 1

    def _evict(self) -> None:
        """Removes the least recently used blocks, of any identity, until the folder is within the budget (the newest
        block stays: a budget below one block keeps one); an identity's folder goes with its last block."""
        while True:
            with self.lock:
                if self.bytes <= self.limit or len(self.index) <= 1:
                    return
                entry, size = next(iter(self.index.items()))
                self._drop(entry)
                emptied = entry[0] != self.identity and self.per_identity[entry[0]] <= 0
            if not _remove(self._path(entry[1], entry[0])):  # a read-only folder: it stays, counted, and nothing more goes
                with self.lock:
                    self._add(entry, size)
                    self.index.move_to_end(entry, last=False)
                self._warn("could not remove %s to keep the folder within --prefix-cache-disk", self._path(entry[1], entry[0]))
                return
            self.num_evicted += 1
            if emptied:
                del self.per_identity[entry[0]]
                for sub in _entries(self.folder / entry[0], SUBFOLDER_NAME):
                    _remove(sub.path, folder=True)
                _remove(self.folder / entry[0], folder=True)

    def flush(self) -> None:
        """Waits until every queued block is on disk."""
        self.writes.join()

    def close(self) -> None:
        self.flush()
        self.writes.put(None)

    # -- restoring (the engine thread) -----------------------------------------------------------------

    def load(self, key: str, block_id: int) -> bool:
        """Reads a stored block into the pool's block `block_id`; False when it is missing or bad (a miss)."""
        return self.load_many([key], [block_id]) == 1

    def load_many(self, keys: Sequence[str], block_ids: Sequence[int]) -> int:
        """Reads stored blocks, in order, into the pool's blocks `block_ids`, until one is missing, not a regular file of
        a block's size, truncated or corrupt (that file is deleted, with a warning); returns how many were read. Each
        file is read straight into its block's rows in the pool, one scatter read (readv) per file: no intermediate
        buffer (a fresh one faulted in 49 MB of pages for a 4,000-token prompt, and the copies out of it cost as much
        again), and the checksum is taken over the rows it filled. A block that fails its check is left uncached (its
        rows are garbage nobody reads)."""
        count = 0
        for key, block_id in zip(keys, block_ids):
            if not self._read_into(key, block_id):
                break
            count += 1
        with self.lock:
            for key in keys[:count]:
                if (self.identity, key) in self.index:
                    self.index.move_to_end((self.identity, key))
        for key in keys[:count]:
            try:
                os.utime(self._path(key))  # its place in the eviction order survives a restart (and other servers see it)
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
        """Reads one block; any problem is a miss. The file is opened non-blocking and without following a link (a FIFO
        planted under a key's name would block a plain open, and the engine with it) and read only when fstat says it is
        a regular file of a block's size."""
        path = self._path(key)
        try:
            problem = self._check_and_read(path, block_id)
        except Exception as exc:  # noqa: BLE001 - a disk error (EIO, a vanished mount), anything: a miss, never a failed request
            problem = f"cannot be read: {exc}"
        if problem is None:
            return True
        with self.lock:
            self._drop((self.identity, key))
        if problem != "missing":
            self.num_rejected += 1
            self._warn("ignoring %s (%s): a miss", path, problem)
            if problem != "not a regular file":  # a FIFO or link is left alone: someone put it there on purpose
                _remove(path)
        return False

    def _check_and_read(self, path: Path, block_id: int) -> str | None:
        try:
            fd = os.open(path, READ_FLAGS)
        except FileNotFoundError:
            return "missing"
        except OSError as exc:  # ELOOP: a symbolic link
            return "not a regular file" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else f"cannot be opened: {exc}"
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return "not a regular file"
            if info.st_size != self.file_nbytes:
                return "truncated" if info.st_size < self.file_nbytes else "not a block of this pool"
            header = bytearray(HEADER.size)
            rows = self._rows(block_id)
            if os.readv(fd, [header, *rows]) != self.file_nbytes:
                return "truncated"
        finally:
            os.close(fd)
        magic, length, crc = HEADER.unpack_from(header)
        if magic != MAGIC or length != self.block_nbytes:
            return "not a block of this pool"
        found = 0
        for row in rows:
            found = zlib.crc32(row, found)
        return None if found == crc else "its checksum does not match"


__all__ = ["PrefixStore", "block_shape", "chain", "open_store", "package_identity", "scan"]
