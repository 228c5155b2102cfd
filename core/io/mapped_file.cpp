#include "core/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace mt {

namespace {

const char* step_words(MapFileError::Step step) {
  switch (step) {
    case MapFileError::Step::open:
      return "cannot open";
    case MapFileError::Step::stat:
      return "cannot stat";
    case MapFileError::Step::not_regular_file:
      return "not a regular file";
    case MapFileError::Step::mmap:
      return "cannot mmap";
  }
  return "cannot map";
}

std::string describe(const std::string& path, MapFileError::Step step, int err) {
  if (err == 0) return fmt::format("{}: {}", path, step_words(step));
  return fmt::format("{}: {}: {}", path, step_words(step), std::strerror(err));
}

}  // namespace

MapFileError::MapFileError(std::string path, Step step, int err)
    : FileError(describe(path, step, err)), path_(std::move(path)), step_(step), err_(err) {}

MappedFile MappedFile::open(const std::string& path, MapOptions options) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait forever for a writer. (It has no effect on
  // regular files; a FIFO is refused below, after fstat.)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw MapFileError(path, MapFileError::Step::open, errno);
  // Closes fd (keeping errno of the failed call) and throws.
  auto fail = [&](MapFileError::Step step, int err) {
    ::close(fd);
    return MapFileError(path, step, err);
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw fail(MapFileError::Step::stat, errno);
  // Only a regular file has a size to map: a FIFO, socket or device has none worth trusting (a FIFO reports
  // 0 and would map as an empty file), so those are refused whatever the options.
  const bool special = S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode);
  if ((options.require_regular_file || special) && !S_ISREG(st.st_mode))
    throw fail(MapFileError::Step::not_regular_file, 0);
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) throw fail(MapFileError::Step::mmap, errno);
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return MappedFile(data, size);
}

MappedFile::~MappedFile() { unmap(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::unmap() noexcept {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace mt
