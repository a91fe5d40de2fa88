// Packing a weight into an op's own layout when the session is made (QMatMul, BMatMul): on every core, and with the
// weight's mapped source pages given back after, so that RSS holds each weight once.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <thread>
#include <vector>

namespace ortinf {

// A packed weight's buffer. From 2 MB on, it is 2 MB-aligned and asked to be backed by transparent huge pages: where
// the kernel's THP mode is "madvise" (the default of many distributions, and of this project's machines) a plain
// allocation gets 4 KB pages, and a one-row GEMV, which streams each weight once per token, then takes a TLB miss
// every 64 lines. Measured on the EPYC (issue 43; one thread, one row, 1536 x 8960): int4 23.5 -> 25.1 GB/s, int8
// 28.9 -> 30.6. RSS is unchanged (the tail of the last 2 MB is never touched); where THP is off this is a no-op.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using PackedBuffer = std::unique_ptr<T[], FreeDeleter>;

template <typename T>
PackedBuffer<T> packed_buffer(size_t count) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = std::max<size_t>(1, count * sizeof(T));
  void* p = nullptr;
  if (posix_memalign(&p, bytes >= kHuge ? kHuge : 64, bytes) != 0) throw std::bad_alloc();
  if (bytes >= kHuge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint: refused where THP is off, which is fine
  return PackedBuffer<T>(static_cast<T*>(p));
}

// Runs fn(begin, end) over [0, count) split into one contiguous range per core (a 7B int4 model's 4.4 GB of
// weights: packed in ~5 s on one core of this project's machines, bound by reading the mapped file).
template <typename Fn>
void pack_in_parallel(int64_t count, Fn fn) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(count, std::thread::hardware_concurrency()));
  std::vector<std::thread> workers;
  for (int64_t t = 1; t < threads; ++t) workers.emplace_back(fn, count * t / threads, count * (t + 1) / threads);
  fn(0, count / threads);
  for (std::thread& worker : workers) worker.join();
}

// Drops this process's pages of [data, data + bytes) when they lie in a private file mapping (/proc/self/maps)
// and every one of them is still the file's page, never copied on write (/proc/self/pagemap: present pages
// are file pages, none swapped), which is how ORT loads page-aligned external data on Linux (each tensor
// mapped rw-p on its own, never written): after packing, the kernel never reads them again, and were
// anything to, the same bytes come back from the file. Anything else (a heap buffer, a page written) is
// left alone. Without this, RSS after load would hold each weight twice: the mapped source pages the
// packing touched, and the packed copy. (smaps' per-mapping Anonymous count says the same, but reading
// smaps walks every mapping's page tables: ~0.1 s a call at 7B, 25 s for a model's 400 weights.)
inline bool unwritten_file_pages(uintptr_t first, uintptr_t last, long page) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return false;
  char line[4096];
  bool file = false;
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long lo = 0, hi = 0, offset = 0, inode = 0;
    char perms[5] = {0}, dev[32] = {0};
    if (std::sscanf(line, "%lx-%lx %4s %lx %31s %lu", &lo, &hi, perms, &offset, dev, &inode) != 6) continue;
    if (lo <= first && last <= hi) {
      file = inode != 0 && perms[0] == 'r' && perms[3] == 'p';
      break;
    }
  }
  std::fclose(maps);
  if (!file) return false;
  FILE* pagemap = std::fopen("/proc/self/pagemap", "rb");
  if (pagemap == nullptr) return false;
  bool clean = std::fseek(pagemap, static_cast<long>(first / page * sizeof(uint64_t)), SEEK_SET) == 0;
  uint64_t entries[512];
  for (uintptr_t at = first; clean && at < last;) {
    const size_t want = std::min<size_t>(512, (last - at) / page);
    clean = std::fread(entries, sizeof(uint64_t), want, pagemap) == want;
    for (size_t i = 0; clean && i < want; ++i) {
      const bool present = entries[i] >> 63 & 1, swapped = entries[i] >> 62 & 1, file_page = entries[i] >> 61 & 1;
      clean = !swapped && (!present || file_page);
    }
    at += want * page;
  }
  std::fclose(pagemap);
  return clean;
}

inline void release_mapped(const void* data, size_t bytes) {
  const long page = sysconf(_SC_PAGESIZE);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data), end = begin + bytes;
  if (page <= 0) return;
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first && unwritten_file_pages(first, last, page)) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace ortinf
