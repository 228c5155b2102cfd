// mapped_file.h: a whole file mapped read-only (the data and checkpoint readers both use it), and the
// error that says which step of mapping failed so each caller can rethrow it in its own words.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/io/file_error.h"

namespace mt {

// Why MappedFile::open failed. Callers catch it and rethrow their own error type (DataError,
// CheckpointError) with their own wording; what() is a generic "PATH: STEP: strerror" for anyone else.
class MapFileError : public FileError {
 public:
  enum class Step { open, stat, not_regular_file, mmap };
  MapFileError(std::string path, Step step, int err);
  const std::string& path() const { return path_; }
  Step step() const { return step_; }
  int err() const { return err_; }  // errno of the failing call; 0 for not_regular_file

 private:
  std::string path_;
  Step step_;
  int err_;
};

struct MapOptions {
  // Refuse anything but a regular file (a directory, a device) with Step::not_regular_file before
  // trying to map it; without it such a file fails wherever the system call does.
  bool require_regular_file = false;
};

// A whole file mapped read-only, unmapped on destruction. Empty files map to data() == nullptr, size 0;
// so does a default-constructed or moved-from MappedFile. The mapping stays valid after the file is
// closed, renamed or removed.
class MappedFile {
 public:
  MappedFile() = default;
  static MappedFile open(const std::string& path, MapOptions options = {});  // throws MapFileError
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }  // bytes

 private:
  MappedFile(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  void unmap() noexcept;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mt
