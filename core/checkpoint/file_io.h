// file_io.h: the POSIX file operations checkpoints are built on: durable writes (fsync of files and
// directories), read-only mappings, and errors that name the path and strerror.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/io/mapped_file.h"

namespace mt::ckpt {

// Throws CheckpointError "PATH: WHAT: strerror(err)".
[[noreturn]] void throw_os_error(const std::string& path, const std::string& what, int err);

std::string join_path(const std::string& dir, const std::string& name);

// A new file (it must not exist) written front to back; sync_and_close() makes it durable.
// Destroying an unclosed file closes it without syncing (the caller removes the tmp dir anyway).
class OutFile {
 public:
  explicit OutFile(std::string path);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  void write(const void* data, size_t bytes);
  void pad_to(int64_t alignment);  // zero bytes up to the next multiple of alignment
  int64_t offset() const { return offset_; }
  void sync_and_close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t offset_ = 0;
};

// Creates `path` holding `text`, fsyncs it (not its directory).
void write_file_durably(const std::string& path, const std::string& text);
std::string read_text_file(const std::string& path);
void fsync_dir(const std::string& dir);

enum class PathKind { missing, file, directory, other };
PathKind path_kind(const std::string& path);  // follows symlinks; throws on errors other than ENOENT
int64_t file_size(const std::string& path);   // throws CheckpointError

// Removes a file or directory tree; returns false (without throwing) when something could not be removed.
bool remove_tree(const std::string& path) noexcept;

// MappedFile::open(path), with its errors rethrown as CheckpointError "PATH: cannot open|cannot stat|
// cannot map: strerror".
MappedFile map_file(const std::string& path);

}  // namespace mt::ckpt
