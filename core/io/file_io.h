// file_io.h: the POSIX file operations the writers are built on: durable writes (fsync of files and directories),
// the atomic replacement of a file (a temporary beside it, fsynced, renamed over it, the directory fsynced),
// whole-file reads, read-only mappings. Every error is a FileError "PATH: WHAT: strerror".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/io/file_error.h"
#include "core/io/mapped_file.h"

namespace mt::io {

// Throws FileError "PATH: WHAT: strerror(err)".
[[noreturn]] void throw_os_error(const std::string& path, const std::string& what, int err);

std::string join_path(const std::string& dir, const std::string& name);

// Writes all `bytes` to `fd`, in pieces as the kernel takes them: retries EINTR, waits for a non-blocking fd
// (EAGAIN) to take more. Returns 0, or the errno of the write that failed (EIO for a write of nothing);
// `written`, when given, gets the bytes written before it. Async-signal-safe (write and poll only): the launcher
// uses it between fork and exec too.
int write_all(int fd, const void* data, size_t bytes, size_t* written = nullptr) noexcept;

// A new file (it must not exist) written front to back; sync_and_close() makes it durable.
// Destroying an unclosed file closes it without syncing (the caller removes it, or the tmp dir it is in).
class OutFile {
 public:
  explicit OutFile(std::string path);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  void write(const void* data, size_t bytes);
  void pad_to(int64_t alignment);  // zero bytes up to the next multiple of alignment
  int64_t offset() const { return offset_; }
  bool is_open() const { return fd_ >= 0; }
  void sync_and_close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t offset_ = 0;
};

// The durable replacement of `path`, streamed: the bytes go to a temporary in the same directory (PATH.tmp unless
// tmp_path names another; a stale one is replaced), and commit() fsyncs it, renames it over `path` and fsyncs the
// directory. Until commit() `path` is untouched; destroyed uncommitted (an error, an exception), the temporary is
// removed. A reader sees the old file or the new one, never a part; after a crash, one of the two.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path, std::string tmp_path = {});
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t bytes);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  int64_t offset() const { return out_.offset(); }
  // fsync and close the temporary, not yet renamed: files that go in together are all synced before the first
  // rename. commit() does it when not done.
  void sync();
  void commit();
  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_path_; }

 private:
  std::string path_, tmp_path_;
  OutFile out_;
  bool committed_ = false;
};

// Replaces `path` by `bytes` atomically and durably (an AtomicFile written whole and committed).
void write_file_atomically(const std::string& path, std::string_view bytes, std::string tmp_path = {});

// Creates `path` (it must not exist) holding `text`, fsyncs it (not its directory): for files inside a
// temporary directory that is itself renamed into place.
void write_file_durably(const std::string& path, std::string_view text);
std::string read_text_file(const std::string& path);
void fsync_dir(const std::string& dir);

enum class PathKind { missing, file, directory, other };
PathKind path_kind(const std::string& path);  // follows symlinks; throws on errors other than ENOENT
int64_t file_size(const std::string& path);

// Removes a file or directory tree; returns false (without throwing) when something could not be removed.
bool remove_tree(const std::string& path) noexcept;

// MappedFile::open(path), with its errors rethrown as FileError "PATH: cannot open|cannot stat|cannot map:
// strerror".
MappedFile map_file(const std::string& path);

}  // namespace mt::io
