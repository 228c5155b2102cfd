#include "core/checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/file_io.h"

namespace mt {
namespace {

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    default:
      throw CheckpointError(fmt::format("safetensors export: dtype {} is not supported", dtype_name(t)));
  }
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void write_all(int fd, const std::string& path, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ckpt::throw_os_error(path, "write failed", n < 0 ? errno : EIO);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace

std::string safetensors_header(const std::vector<SafetensorsSpec>& specs,
                               const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (!first) h += ",";
      first = false;
      h += json_string(k) + ":" + json_string(v);
    }
    h += "}";
  }
  int64_t offset = 0;
  std::set<std::string> names;
  for (const auto& s : specs) {
    if (s.name.empty() || s.name == "__metadata__" || !names.insert(s.name).second)
      throw CheckpointError(fmt::format("safetensors: bad or repeated tensor name '{}'", s.name));
    int64_t bytes = shape_numel(s.shape) * static_cast<int64_t>(dtype_size(s.dtype));
    if (!h.empty() && h.back() != '{') h += ",";
    h += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", json_string(s.name),
                     safetensors_dtype(s.dtype), fmt::join(s.shape, ","), offset, offset + bytes);
    offset += bytes;
  }
  return h + "}";
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), specs_(std::move(specs)) {
  std::string header = safetensors_header(specs_, metadata);
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts at 8 + header size, 8-byte aligned
  ::unlink(tmp_path_.c_str());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) ckpt::throw_os_error(tmp_path_, "cannot create file", errno);
  try {
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
    write_all(fd_, tmp_path_, len, 8);
    write_all(fd_, tmp_path_, header.data(), header.size());
  } catch (...) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void SafetensorsWriter::write(const Tensor& t) {
  if (fd_ < 0 || next_ >= specs_.size()) throw CheckpointError(fmt::format("{}: more tensors than announced", path_));
  const SafetensorsSpec& s = specs_[next_];
  if (t.shape() != s.shape)
    throw CheckpointError(
        fmt::format("{}: tensor {} announced as {} but given {}", path_, s.name, shape_str(s.shape), t.describe()));
  if (t.dtype() == s.dtype) {
    write_all(fd_, tmp_path_, t.raw(), t.nbytes());
  } else {
    Tensor c = Tensor::empty(s.shape, s.dtype);
    c.copy_from(t);
    write_all(fd_, tmp_path_, c.raw(), c.nbytes());
  }
  ++next_;
}

void SafetensorsWriter::finish() {
  if (fd_ < 0) throw CheckpointError(fmt::format("{}: already finished", path_));
  if (next_ != specs_.size())
    throw CheckpointError(fmt::format("{}: {} of {} tensors written", path_, next_, specs_.size()));
  if (::fsync(fd_) != 0) ckpt::throw_os_error(tmp_path_, "fsync failed", errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp_path_.c_str());
    ckpt::throw_os_error(tmp_path_, "close failed", err);
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp_path_.c_str());
    ckpt::throw_os_error(path_, "cannot rename " + tmp_path_ + " to it", err);
  }
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsSpec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, dtype, t.shape()});
  SafetensorsWriter w(path, std::move(specs), metadata);
  for (const auto& [name, t] : tensors) w.write(t);
  w.finish();
}

}  // namespace mt
