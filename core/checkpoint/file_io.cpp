#include "core/checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "core/checkpoint/checkpoint.h"

namespace mt::ckpt {

void throw_os_error(const std::string& path, const std::string& what, int err) {
  throw CheckpointError(fmt::format("{}: {}: {}", path, what, std::strerror(err)));
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

OutFile::OutFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_os_error(path_, "cannot create file", errno);
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    size_t chunk = std::min<size_t>(bytes, size_t{1} << 30);
    ssize_t n = ::write(fd_, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_os_error(path_, fmt::format("write failed at byte {}", offset_), errno);
    }
    if (n == 0) throw_os_error(path_, fmt::format("write failed at byte {}", offset_), EIO);
    p += n;
    bytes -= static_cast<size_t>(n);
    offset_ += n;
  }
}

void OutFile::pad_to(int64_t alignment) {
  int64_t pad = (alignment - offset_ % alignment) % alignment;
  if (pad == 0) return;
  std::vector<char> zeros(static_cast<size_t>(pad), 0);
  write(zeros.data(), zeros.size());
}

void OutFile::sync_and_close() {
  if (::fsync(fd_) != 0) throw_os_error(path_, "fsync failed", errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_os_error(path_, "close failed", errno);
}

void write_file_durably(const std::string& path, const std::string& text) {
  OutFile f(path);
  f.write(text.data(), text.size());
  f.sync_and_close();
}

std::string read_text_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_os_error(path, "cannot open", errno);
  std::string text;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw_os_error(path, "read failed", err);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_os_error(dir, "cannot open directory for fsync", errno);
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    throw_os_error(dir, "fsync of directory failed", err);
  }
  ::close(fd);
}

PathKind path_kind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return PathKind::missing;
    throw_os_error(path, "cannot stat", errno);
  }
  if (S_ISDIR(st.st_mode)) return PathKind::directory;
  if (S_ISREG(st.st_mode)) return PathKind::file;
  return PathKind::other;
}

int64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw_os_error(path, "cannot stat", errno);
  return st.st_size;
}

bool remove_tree(const std::string& path) noexcept {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  return !ec;
}

MappedFile map_file(const std::string& path) {
  try {
    return MappedFile::open(path);
  } catch (const MapFileError& e) {
    switch (e.step()) {
      case MapFileError::Step::open:
        throw_os_error(path, "cannot open", e.err());
      case MapFileError::Step::stat:
        throw_os_error(path, "cannot stat", e.err());
      case MapFileError::Step::mmap:
        throw_os_error(path, "cannot map", e.err());
      case MapFileError::Step::not_regular_file:  // not asked for above, but say it right if it ever is
        throw CheckpointError(fmt::format("{}: not a regular file", path));
    }
    throw CheckpointError(e.what());
  }
}

}  // namespace mt::ckpt
