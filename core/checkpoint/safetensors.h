// safetensors.h: a writer for the safetensors format (Hugging Face): an 8-byte little-endian header
// length N, N bytes of JSON header {"__metadata__": {...}, NAME: {"dtype", "shape", "data_offsets": [b, e]}}
// padded with spaces so the data starts 8-byte aligned, then the tensors' bytes back to back.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt {

struct SafetensorsSpec {
  std::string name;
  DType dtype;  // f32 ("F32"), bf16 ("BF16") or f16 ("F16")
  Shape shape;
};

// Streams tensors into `path`: the header is fixed by the specs up front, then write() takes the tensors
// one at a time in spec order (any dtype, converted), so an export never holds the whole model. The file
// appears under its name only when finish() succeeds (tmp file + fsync + rename). Throws CheckpointError.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<SafetensorsSpec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // an unfinished file is removed
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void write(const Tensor& t);  // the next tensor in spec order; its shape must match
  void finish();

 private:
  std::string path_, tmp_path_;
  std::vector<SafetensorsSpec> specs_;
  size_t next_ = 0;
  int fd_ = -1;
};

// The whole header text (JSON, unpadded) for `specs`, as the writer lays them out.
std::string safetensors_header(const std::vector<SafetensorsSpec>& specs,
                               const std::map<std::string, std::string>& metadata);

// Writes `tensors` (name, data converted to `dtype`) in one go.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace mt
