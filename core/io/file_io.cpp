#include "core/io/file_io.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

namespace mt::io {

void throw_os_error(const std::string& path, const std::string& what, int err) {
  throw FileError(fmt::format("{}: {}: {}", path, what, std::strerror(err)));
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

int write_all(int fd, const void* data, size_t bytes, size_t* written) noexcept {
  const char* p = static_cast<const char*>(data);
  const auto finish = [&](int e) {
    if (written) *written = static_cast<size_t>(p - static_cast<const char*>(data));
    return e;
  };
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
    } else if (n == 0) {
      return finish(EIO);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pfd{fd, POLLOUT, 0};
      ::poll(&pfd, 1, 100);
    } else if (errno != EINTR) {
      return finish(errno);
    }
  }
  return finish(0);
}

void OutFile::write(const void* data, size_t bytes) {
  size_t written = 0;
  const int e = write_all(fd_, data, bytes, &written);
  offset_ += static_cast<int64_t>(written);  // the error names the byte the failed write began at, as before
  if (e != 0) throw_os_error(path_, fmt::format("write failed at byte {}", offset_), e);
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

namespace {

// `tmp`, after removing a stale file of that name (a crashed writer's), so that OutFile can create it anew.
std::string without_stale(std::string tmp) {
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) throw_os_error(tmp, "cannot remove the stale temporary", errno);
  return tmp;
}

std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string tmp_path)
    : path_(std::move(path)), tmp_path_(tmp_path.empty() ? path_ + ".tmp" : std::move(tmp_path)),
      out_(without_stale(tmp_path_)) {}

AtomicFile::~AtomicFile() {
  if (!committed_) ::unlink(tmp_path_.c_str());  // out_ closes it after
}

void AtomicFile::write(const void* data, size_t bytes) {
  if (committed_ || !out_.is_open()) throw FileError(fmt::format("{}: written after it was synced", tmp_path_));
  out_.write(data, bytes);
}

void AtomicFile::sync() {
  if (out_.is_open()) out_.sync_and_close();
}

void AtomicFile::commit() {
  if (committed_) throw FileError(fmt::format("{}: committed twice", path_));
  sync();
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    throw_os_error(path_, "cannot rename " + tmp_path_ + " to it", errno);
  committed_ = true;
  fsync_dir(parent_dir(path_));
}

void write_file_atomically(const std::string& path, std::string_view bytes, std::string tmp_path) {
  AtomicFile f(path, std::move(tmp_path));
  f.write(bytes);
  f.commit();
}

void write_file_durably(const std::string& path, std::string_view text) {
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
        throw FileError(fmt::format("{}: not a regular file", path));
    }
    throw FileError(e.what());
  }
}

}  // namespace mt::io
