// Packed weights kept on disk (issue 55: pack at export, map at load). QMatMul and BMatMul read their weights in
// a layout of their own (16-column tiles and panels), which the package does not hold: model.onnx.data holds
// MatMulNBits' B and a bf16 W once, for every graph and provider. A kernel used to pack its weight when ORT made
// it (0.5 s of a 1.5B int4 load, 4 s at 7B, and a private copy per process). Now the first session over a
// package packs as before and ortinf_packed_flush() writes what its kernels packed beside the weights
// (model.onnx.data.<isa>.packed); every later session maps that file instead of packing: no repack, no copy,
// and the page cache's pages are shared by every process that serves the package.
//
// Keys: a kernel names what it packed (op, shapes, ISA group) and the store adds the weight's offset in the file
// it is mapped from (/proc/self/maps), so a key means one weight of one package in one layout. The store records
// the data file's size and modification time: a package written again makes it stale (packed and written anew).
// Every region carries a checksum, checked when a kernel maps it (the read also makes the pages resident); a
// store that is truncated, damaged or not ortinf's is refused with one line that says to delete it.
// ORTINF_PACKED_STORE=0 turns the store off (kernels pack at load as before, nothing is written).
#pragma once

#include <onnxruntime_c_api.h>

#include <cstddef>
#include <memory>
#include <string>

namespace ortinf {

constexpr int kMaxRegions = 2;

// What a kernel reads: its packed regions and whatever keeps them alive (its own buffer or the mapped store).
struct Packed {
  std::shared_ptr<void> owner;
  const void* region[kMaxRegions] = {nullptr, nullptr};
};

// Looks `key` up for the weight whose bytes start at `source` (a constant input). *found is true and `out`
// points into the mapped store when the store beside source's file holds the key with these sizes; false when
// the kernel has to pack. A damaged store is an error status (the session is refused, nothing runs on it).
OrtStatus* find_packed(const void* source, const std::string& key, const size_t* sizes, int regions, Packed* out, bool* found);

// Remembers what a kernel packed, for ortinf_packed_flush() to write beside source's file.
void remember_packed(const void* source, const std::string& key, const Packed& packed, const size_t* sizes, int regions);

}  // namespace ortinf
