// safetensors.h: a writer and a reader for the safetensors format (Hugging Face): an 8-byte little-endian header
// length N, N bytes of JSON header {"__metadata__": {...}, NAME: {"dtype", "shape", "data_offsets": [b, e]}}
// padded with spaces so the data starts 8-byte aligned, then the tensors' bytes back to back.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"

namespace mt {

class MappedFile;  // core/io/mapped_file.h
namespace io {
class AtomicFile;  // core/io/file_io.h
}

struct SafetensorsSpec {
  std::string name;
  DType dtype;  // f32 ("F32"), bf16 ("BF16") or f16 ("F16")
  Shape shape;
};

// Streams tensors into `path`: the header is fixed by the specs up front, then write() takes the tensors
// one at a time in spec order (any dtype, converted), so an export never holds the whole model. The file
// appears under its name only when finish() succeeds (an io::AtomicFile: tmp file, fsync, rename, directory fsync).
// Throws CheckpointError, or the FileError of a failed write.
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
  std::string path_;
  std::vector<SafetensorsSpec> specs_;
  size_t next_ = 0;
  std::unique_ptr<io::AtomicFile> file_;  // null once finished
};

// The whole header text (JSON, unpadded) for `specs`, as the writer lays them out.
std::string safetensors_header(const std::vector<SafetensorsSpec>& specs,
                               const std::map<std::string, std::string>& metadata);

// Writes `tensors` (name, data converted to `dtype`) in one go.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata = {});

// Reads a safetensors file (mapped, not loaded): the header is parsed and every entry checked on open (dtype
// F32, BF16 or F16, offsets inside the data and matching the shape); tensors are copied out on demand. Throws
// CheckpointError naming the file and the tensor.
class SafetensorsReader {
 public:
  struct Entry {
    DType dtype;
    Shape shape;
    int64_t begin = 0, end = 0;  // byte offsets within the data section
  };
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& tensors() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  const Entry& entry(const std::string& name) const;  // throws if absent
  Tensor read(const std::string& name) const;         // host tensor in the stored dtype

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  const uint8_t* data_ = nullptr;  // the data section
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mt
