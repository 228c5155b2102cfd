// metadata.h: the tensor index of a checkpoint and its YAML form (metadata.yaml, and the per-rank index
// fragments that rank 0 merges into it).
//
// metadata.yaml:
//   format_version: 1
//   iteration: 1000
//   state: {values: {consumed_samples: "8000", ...}}     string map
//   config: |                                             the resolved config YAML, a literal block
//     model: ...
//   tensors:
//     - name: model.layers.0.attn.qkv.weight
//       dtype: fp32
//       shape: [192, 64]                                  global shape
//       slices:                                           axis-aligned blocks, disjoint
//         - {file: rank_00000.bin, offset: 0, bytes: 49152, start: [0, 0], extent: [192, 64], crc32: 0x1c291ca3}
//   metadata_crc32: 0x5e0c2a11                            last line: CRC-32 of every byte before it
// (metadata.yaml only; a file without the last line, from an older build, loads with a warning.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"

namespace mt::ckpt {

inline constexpr int64_t kFormatVersion = 1;
inline constexpr const char* kMetadataFile = "metadata.yaml";

struct SliceEntry {
  std::string file;               // data file name inside the checkpoint directory
  int64_t offset = 0, bytes = 0;  // byte range in that file
  std::vector<int64_t> start;     // per dimension
  std::vector<int64_t> extent;    // per dimension; bytes = prod(extent) * dtype size
  uint32_t crc = 0;               // CRC-32 of the bytes
};

struct TensorEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;  // global
  std::vector<SliceEntry> slices;
};

struct Metadata {
  CheckpointState state;
  std::vector<TensorEntry> tensors;
};

std::string rank_data_file(int rank);   // "rank_00000.bin"
std::string rank_index_file(int rank);  // "rank_00000.index.yaml"

std::string emit_metadata(const CheckpointState& state, const std::vector<TensorEntry>& tensors);
std::string emit_index_fragment(int rank, const std::vector<TensorEntry>& tensors);

// Parse and check the structure (fields, types, format version, slices inside the global shape and
// disjoint); `path` names the file in every error. Data files are not looked at.
Metadata parse_metadata(const std::string& path, const std::string& text);
std::vector<TensorEntry> parse_index_fragment(const std::string& path, const std::string& text);

// Adds `more` into `into`: new names are appended, known names must agree on dtype and shape and get
// the slices added. `where` names the source in errors.
void merge_tensor_entries(std::vector<TensorEntry>& into, std::vector<TensorEntry> more, const std::string& where);

// Slices within the global shape, of consistent size, and pairwise disjoint.
void check_tensor_entry(const std::string& where, const TensorEntry& t);

}  // namespace mt::ckpt
