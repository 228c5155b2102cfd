#include "core/io/tensorboard.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include "core/io/crc.h"
#include "core/io/file_error.h"

namespace mt {
namespace {

// ---- the protobuf wire format, only what an Event with a scalar Summary needs ----

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }
template <class U>
void put_little_endian(std::string& out, U v) {
  for (size_t i = 0; i < sizeof(U); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event (tensorflow/core/util/event.proto): wall_time = 1 (double), step = 2 (int64), file_version = 3,
// summary = 5. Summary (summary.proto): repeated Value value = 1; Value: tag = 1, simple_value = 2 (float).
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, kFixed64);
  put_little_endian(e, std::bit_cast<uint64_t>(wall_time));
  if (step != 0) {  // proto3 leaves default values out
    put_key(e, 2, kVarint);
    put_varint(e, static_cast<uint64_t>(step));  // a negative int64 takes ten bytes, as protobuf writes it
  }
  return e;
}

std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_key(v, 2, kFixed32);
  put_little_endian(v, std::bit_cast<uint32_t>(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf.data();
}

}  // namespace

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error(fmt::format("tensorboard: cannot create the directory {}: {}", dir, ec.message()));
  const double now = unix_time_now();
  // The pid and a count of this process's writers keep two writers started in the same second (a quick restart,
  // a second writer) from sharing a file, as PyTorch's SummaryWriter does; TensorBoard reads any file whose name
  // holds "tfevents".
  static std::atomic<int> writers{0};
  path_ = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<int64_t>(now),
                                                    host_name(), ::getpid(), writers++))
              .string();
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw std::runtime_error(fmt::format("tensorboard: cannot open {} for writing", path_));
  std::string first = event_header(now, 0);
  put_bytes(first, 3, "brain.Event:2");
  write_record(first);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (out_.is_open()) out_.flush();  // no throw from a destructor; flush() reports errors while running
}

void TensorBoardWriter::scalar(std::string_view tag, int64_t step, float value, double wall_time) {
  write_record(scalar_event(wall_time, step, tag, value));
}

void TensorBoardWriter::flush() {
  errno = 0;
  out_.flush();
  if (!out_) throw_write_error();
}

void TensorBoardWriter::throw_write_error() {
  const int os_error = errno;  // the failed write's, read before close() can change it
  out_.close();
  throw FileError(fmt::format("tensorboard: cannot write {}: {}", path_,
                              os_error != 0 ? std::strerror(os_error) : "unknown error"));
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string header;
  put_little_endian(header, static_cast<uint64_t>(data.size()));
  const uint32_t length_crc = masked_crc32c(header.data(), header.size());
  put_little_endian(header, length_crc);
  std::string footer;
  put_little_endian(footer, masked_crc32c(data.data(), data.size()));
  errno = 0;
  out_ << header << data << footer;
  if (!out_) throw_write_error();
}

}  // namespace mt
