// The packed-weight store (packed_store.h): finding a weight's file, mapping and checking a store, writing one.
//
// File layout (little-endian; x86-64 and aarch64 Linux):
//   header (4096 bytes): magic "ORTPACK1", version, the data file's size and mtime (ns), the index's offset, bytes
//                        and checksum, the file's size, the entry count
//   regions: each at a 2 MiB boundary when it is 2 MiB or more (the mapping is 2 MiB-aligned, so the page cache's
//            huge folios map as huge pages: a one-row GEMV streams its weights at the THP rate), else at 4 KiB;
//            the gaps are holes (no disk blocks)
//   index: per entry: u32 key length, key, u32 region count, per region u64 offset, bytes, checksum

#include "packed_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "mapped_pages.h"
#include "ort_glue.h"
#include "qmatmul_impl.h"

namespace ortinf {
namespace {

constexpr char kMagic[8] = {'O', 'R', 'T', 'P', 'A', 'C', 'K', '1'};
constexpr uint64_t kVersion = 1, kHeaderBytes = 4096, kHuge = uint64_t{2} << 20, kChunk = uint64_t{4} << 20;

struct Header {
  char magic[8];
  uint64_t version, data_size, data_mtime_ns, index_offset, index_bytes, index_checksum, file_size, entries;
};

struct Region {
  uint64_t offset = 0, bytes = 0, checksum = 0;
};

struct Entry {
  std::vector<Region> regions;
  bool checked = false;
};

struct Pending {
  std::string key;
  std::weak_ptr<void> owner;  // weak: a session dropped before the flush (or one never flushed) frees its copy
  const void* data[kMaxRegions];
  size_t sizes[kMaxRegions];
  int regions;
};

// One data file's store, opened once per process.
struct Store {
  std::string data_path, path, why_absent, damage;
  uint64_t data_size = 0, data_mtime_ns = 0;
  std::shared_ptr<void> mapping;  // null: no usable store (absent, stale, off); kernels pack
  const uint8_t* base = nullptr;
  uint64_t size = 0;
  std::unordered_map<std::string, Entry> index;
  std::vector<Pending> pending;
  int64_t mapped = 0, packed = 0;  // since the last flush
};

std::mutex g_mutex;
std::map<std::string, std::unique_ptr<Store>> g_stores;  // by data file path

bool store_off() {
  const char* off = std::getenv("ORTINF_PACKED_STORE");
  return off != nullptr && std::strcmp(off, "0") == 0;
}

uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 33);
}

uint64_t chunk_hash(const uint8_t* p, uint64_t n) {
  uint64_t lane[4] = {0x9e3779b97f4a7c15ULL, 0xbf58476d1ce4e5b9ULL, 0x94d049bb133111ebULL, 0x2545f4914f6cdd1dULL};
  uint64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * j, 8);
      lane[j] = (lane[j] ^ w) * 0x100000001b3ULL;
      lane[j] = (lane[j] << 29) | (lane[j] >> 35);
    }
  uint64_t tail = n;
  for (; i < n; ++i) tail = (tail ^ p[i]) * 0x100000001b3ULL;
  return mix(lane[0] ^ mix(lane[1] ^ mix(lane[2] ^ mix(lane[3] ^ tail))));
}

// A checksum of [p, p + n): 4 MiB chunks hashed on every core, combined by position.
uint64_t checksum(const void* data, uint64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  std::vector<uint64_t> hashes(static_cast<size_t>(std::max<int64_t>(chunks, 1)), 0);
  pack_in_parallel(chunks, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c)
      hashes[c] = chunk_hash(p + c * kChunk, std::min<uint64_t>(kChunk, n - c * kChunk));
  });
  uint64_t total = mix(n);
  for (int64_t c = 0; c < chunks; ++c) total = mix(total ^ (hashes[c] + static_cast<uint64_t>(c) * 0x9e3779b97f4a7c15ULL));
  return total;
}

// The file `source` is mapped from and its offset there (/proc/self/maps); false for anything else.
bool locate(const void* source, std::string* path, uint64_t* offset) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return false;
  const auto at = reinterpret_cast<uintptr_t>(source);
  char line[4096 + 256];
  bool found = false;
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long lo = 0, hi = 0, file_offset = 0, inode = 0;
    char perms[5] = {0}, dev[32] = {0};
    int end = 0;
    if (std::sscanf(line, "%lx-%lx %4s %lx %31s %lu %n", &lo, &hi, perms, &file_offset, dev, &inode, &end) != 6) continue;
    if (at < lo || at >= hi) continue;
    std::string name(line + end);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    found = inode != 0 && !name.empty() && name[0] == '/' && name.find(" (deleted)") == std::string::npos;
    if (found) {
      *path = name;
      *offset = file_offset + (at - lo);
    }
    break;
  }
  std::fclose(maps);
  return found;
}

std::string store_path(const std::string& data_path) {
  return data_path + "." + qmatmul_kernels().name + ".packed";
}

std::string damaged(const Store& s, const std::string& what) {
  return "the packed weights in " + s.path + " are damaged (" + what +
         "): delete that file; the next load packs the weights again and rewrites it";
}

bool read_index(Store* s) {
  Header h;
  std::memcpy(&h, s->base, sizeof h);
  if (h.index_offset > s->size || h.index_bytes > s->size - h.index_offset) {
    s->damage = damaged(*s, "its index lies outside the file");
    return false;
  }
  const uint8_t* p = s->base + h.index_offset;
  const uint8_t* end = p + h.index_bytes;
  if (checksum(p, h.index_bytes) != h.index_checksum) {
    s->damage = damaged(*s, "its index does not match its checksum");
    return false;
  }
  auto take = [&](void* out, size_t n) {
    if (static_cast<size_t>(end - p) < n) return false;
    std::memcpy(out, p, n);
    p += n;
    return true;
  };
  for (uint64_t e = 0; e < h.entries; ++e) {
    uint32_t key_bytes = 0, regions = 0;
    if (!take(&key_bytes, 4) || static_cast<size_t>(end - p) < key_bytes) break;
    std::string key(reinterpret_cast<const char*>(p), key_bytes);
    p += key_bytes;
    Entry entry;
    if (!take(&regions, 4) || regions > kMaxRegions) break;
    entry.regions.resize(regions);
    bool ok = true;
    for (Region& r : entry.regions) ok = ok && take(&r, sizeof r) && r.offset <= s->size && r.bytes <= s->size - r.offset;
    if (!ok) break;
    s->index.emplace(std::move(key), std::move(entry));
  }
  if (s->index.size() != h.entries) {
    s->damage = damaged(*s, "its index is cut short or points outside the file");
    return false;
  }
  return true;
}

// Maps and checks the store beside data_path (once per process); sets why_absent or damage where it cannot.
void open_store(Store* s) {
  struct stat data {};
  if (stat(s->data_path.c_str(), &data) != 0) {
    s->why_absent = "the weights' file cannot be read";
    return;
  }
  s->data_size = static_cast<uint64_t>(data.st_size);
  s->data_mtime_ns = static_cast<uint64_t>(data.st_mtim.tv_sec) * 1000000000ULL + static_cast<uint64_t>(data.st_mtim.tv_nsec);
  const int fd = open(s->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    s->why_absent = errno == ENOENT ? "none yet" : std::string("cannot open it: ") + std::strerror(errno);
    return;
  }
  struct stat st {};
  Header h{};
  const bool sized = fstat(fd, &st) == 0;
  const bool read_header = sized && pread(fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h);
  if (!read_header || std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kVersion) {
    close(fd);
    s->damage = damaged(*s, read_header ? "not an ortinf packed-weight file of this version" : "shorter than its header");
    return;
  }
  if (h.data_size != s->data_size || h.data_mtime_ns != s->data_mtime_ns) {
    close(fd);
    s->why_absent = "stale: the package's weights were written after it";
    return;
  }
  if (static_cast<uint64_t>(st.st_size) != h.file_size) {
    close(fd);
    s->damage = damaged(*s, "truncated: " + std::to_string(st.st_size) + " of " + std::to_string(h.file_size) + " bytes");
    return;
  }
  // 2 MiB-aligned: reserve, then map the file over the aligned start
  const uint64_t size = h.file_size;
  void* reserve = mmap(nullptr, size + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserve == MAP_FAILED) {
    close(fd);
    s->why_absent = "cannot map it";
    return;
  }
  const uintptr_t start = (reinterpret_cast<uintptr_t>(reserve) + kHuge - 1) / kHuge * kHuge;
  void* mapped = mmap(reinterpret_cast<void*>(start), size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
  close(fd);
  const uintptr_t reserve_end = reinterpret_cast<uintptr_t>(reserve) + size + kHuge;
  if (start > reinterpret_cast<uintptr_t>(reserve)) munmap(reserve, start - reinterpret_cast<uintptr_t>(reserve));
  if (reserve_end > start + size) munmap(reinterpret_cast<void*>(start + size), reserve_end - start - size);
  if (mapped == MAP_FAILED) {
    munmap(reinterpret_cast<void*>(start), size);
    s->why_absent = "cannot map it";
    return;
  }
  madvise(mapped, size, MADV_HUGEPAGE);  // hints: refused where unsupported, which is fine
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
  madvise(mapped, size, MADV_POPULATE_READ);  // one pass of page-table set-up instead of a fault per page
  s->mapping = std::shared_ptr<void>(mapped, [size](void* p) { munmap(p, size); });
  s->base = static_cast<const uint8_t*>(mapped);
  s->size = size;
  if (!read_index(s)) {
    s->mapping.reset();
    s->base = nullptr;
  }
}

// The store for the file `source` lies in (null: not a mapped file, or the store is off); sets *offset.
Store* store_for(const void* source, uint64_t* offset) {
  if (store_off()) return nullptr;
  std::string data_path;
  if (!locate(source, &data_path, offset)) return nullptr;
  std::unique_ptr<Store>& s = g_stores[data_path];
  if (!s) {
    s = std::make_unique<Store>();
    s->data_path = data_path;
    s->path = store_path(data_path);
    open_store(s.get());
  }
  return s.get();
}

std::string full_key(const std::string& key, uint64_t offset) { return key + " @" + std::to_string(offset); }

bool write_all(int fd, const void* data, uint64_t bytes, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = pwrite(fd, p, std::min<uint64_t>(bytes, uint64_t{1} << 30), static_cast<off_t>(offset));
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
  return true;
}

// Writes s's pending regions as a new store (a temporary file renamed over the old: a reader never sees half).
std::string write_store(Store* s) {
  std::vector<uint8_t> index;
  auto put = [&index](const void* p, size_t n) { index.insert(index.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n); };
  uint64_t at = kHeaderBytes;
  std::vector<std::shared_ptr<void>> alive;
  for (const Pending& p : s->pending)
    if (auto owner = p.owner.lock()) alive.push_back(std::move(owner));
  if (alive.size() != s->pending.size()) return "not written (the session was closed before its weights were written)";
  std::vector<std::vector<Region>> regions(s->pending.size());
  for (size_t e = 0; e < s->pending.size(); ++e) {
    const Pending& p = s->pending[e];
    for (int r = 0; r < p.regions; ++r) {
      const uint64_t align = p.sizes[r] >= kHuge ? kHuge : 4096;
      at = (at + align - 1) / align * align;
      regions[e].push_back({at, p.sizes[r], checksum(p.data[r], p.sizes[r])});
      at += p.sizes[r];
    }
    const uint32_t key_bytes = static_cast<uint32_t>(p.key.size()), count = static_cast<uint32_t>(p.regions);
    put(&key_bytes, 4);
    put(p.key.data(), p.key.size());
    put(&count, 4);
    for (const Region& r : regions[e]) put(&r, sizeof r);
  }
  at = (at + 4095) / 4096 * 4096;
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.data_size = s->data_size;
  h.data_mtime_ns = s->data_mtime_ns;
  h.index_offset = at;
  h.index_bytes = index.size();
  h.index_checksum = checksum(index.data(), index.size());
  h.file_size = at + index.size();
  h.entries = s->pending.size();

  const std::string dir = s->path.substr(0, s->path.rfind('/') + 1);
  const std::string partial = s->path + ".partial-" + std::to_string(getpid());
  const int fd = open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::string("not written (") + std::strerror(errno) + "): " + s->path;
  bool ok = ftruncate(fd, static_cast<off_t>(h.file_size)) == 0;
  for (size_t e = 0; ok && e < s->pending.size(); ++e)
    for (int r = 0; ok && r < s->pending[e].regions; ++r)
      ok = write_all(fd, s->pending[e].data[r], regions[e][r].bytes, regions[e][r].offset);
  ok = ok && write_all(fd, index.data(), index.size(), h.index_offset);
  ok = ok && write_all(fd, &h, sizeof h, 0);
  const int saved = errno;
  ok = close(fd) == 0 && ok;
  if (!ok || rename(partial.c_str(), s->path.c_str()) != 0) {
    const std::string why = std::strerror(ok ? errno : saved);
    unlink(partial.c_str());
    return "not written (" + why + "): " + s->path;
  }
  return "wrote " + s->path + " (" + std::to_string(h.file_size >> 20) + " MiB, " + std::to_string(h.entries) + " weights)";
}

}  // namespace

OrtStatus* find_packed(const void* source, const std::string& key, const size_t* sizes, int regions, Packed* out, bool* found) {
  *found = false;
  std::lock_guard<std::mutex> lock(g_mutex);
  uint64_t offset = 0;
  Store* s = store_for(source, &offset);
  if (s == nullptr) return nullptr;
  if (!s->damage.empty()) return fail(s->damage);
  if (!s->mapping) return nullptr;
  auto it = s->index.find(full_key(key, offset));
  if (it == s->index.end() || static_cast<int>(it->second.regions.size()) != regions) return nullptr;
  Entry& entry = it->second;
  for (int r = 0; r < regions; ++r)
    if (entry.regions[r].bytes != sizes[r]) return nullptr;
  if (!entry.checked) {
    for (int r = 0; r < regions; ++r)
      if (checksum(s->base + entry.regions[r].offset, entry.regions[r].bytes) != entry.regions[r].checksum) {
        s->damage = damaged(*s, "a weight does not match its checksum: " + key);
        return fail(s->damage);
      }
    entry.checked = true;
  }
  out->owner = s->mapping;
  for (int r = 0; r < regions; ++r) out->region[r] = s->base + entry.regions[r].offset;
  ++s->mapped;
  *found = true;
  return nullptr;
}

void remember_packed(const void* source, const std::string& key, const Packed& packed, const size_t* sizes, int regions) {
  std::lock_guard<std::mutex> lock(g_mutex);
  uint64_t offset = 0;
  Store* s = store_for(source, &offset);
  if (s == nullptr || !s->damage.empty()) return;
  ++s->packed;
  if (s->mapping) return;  // a store that lacks a weight is kept as it is (the package changed under a stale mtime)
  Pending p{full_key(key, offset), packed.owner, {nullptr, nullptr}, {0, 0}, regions};
  for (int r = 0; r < regions; ++r) {
    p.data[r] = packed.region[r];
    p.sizes[r] = sizes[r];
  }
  s->pending.push_back(std::move(p));
}

}  // namespace ortinf

// Called after a session is made (ortinf/kernels/library.py): writes a store for every package whose kernels packed
// at this load, and says per package what was mapped, packed and written, one line each ("" when nothing was).
// write 0 drops what was packed instead (a temporary package, such as the exporter's verification windows).
extern "C" __attribute__((visibility("default"))) const char* ortinf_packed_flush(int write) {
  static thread_local std::string summary;
  summary.clear();
  std::lock_guard<std::mutex> lock(ortinf::g_mutex);
  for (auto it = ortinf::g_stores.begin(); it != ortinf::g_stores.end();) {
    ortinf::Store* s = it->second.get();
    if (s->mapped == 0 && s->packed == 0) {
      ++it;
      continue;
    }
    std::string line = it->first + ": " + std::to_string(s->mapped) + " mapped, " + std::to_string(s->packed) + " packed";
    const bool wrote = write && !s->pending.empty();
    if (wrote) line += " (store: " + s->why_absent + "); " + ortinf::write_store(s);
    s->pending.clear();
    summary += line + "\n";
    s->mapped = s->packed = 0;
    // a store just written is opened afresh by the next session (which then maps it); the packed copies this
    // session's kernels hold are theirs (the pending list's references go with the entry)
    it = wrote ? ortinf::g_stores.erase(it) : std::next(it);
  }
  return summary.c_str();
}

// Forgets every opened store (tests, and a package re-exported in place by this process): the next session opens
// them again. Kernels made before keep their mappings.
extern "C" __attribute__((visibility("default"))) void ortinf_packed_forget() {
  std::lock_guard<std::mutex> lock(ortinf::g_mutex);
  ortinf::g_stores.clear();
}
