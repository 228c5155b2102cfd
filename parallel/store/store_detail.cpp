// store_detail.cpp: error-message helpers and the frame codec shared by the store implementations.
#include "parallel/store/store_detail.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <type_traits>

namespace mt::store_detail {

std::string format_seconds(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

std::string join_keys(const std::vector<std::string>& keys, size_t max_shown) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < max_shown; ++i) out += (i ? ", " : "") + keys[i];
  if (keys.size() > max_shown) out += " and " + std::to_string(keys.size() - max_shown) + " more";
  return out;
}

Clock::time_point deadline_after(Millis timeout) {
  constexpr Millis kForever = std::chrono::hours(24 * 365 * 10);
  return Clock::now() + std::clamp(timeout, Millis(0), kForever);
}

std::optional<int64_t> parse_counter(const Bytes& value) {
  auto first = reinterpret_cast<const char*>(value.data());
  auto last = first + value.size();
  int64_t out = 0;
  auto [end, ec] = std::from_chars(first, last, out);
  if (ec != std::errc() || end != last || value.empty()) return std::nullopt;
  return out;
}

Bytes format_counter(int64_t value) { return text_bytes(std::to_string(value)); }

FrameWriter& FrameWriter::u8(uint8_t v) {
  buf_.push_back(v);
  return *this;
}

FrameWriter& FrameWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(uint8_t(v >> (8 * i)));
  return *this;
}

FrameWriter& FrameWriter::i64(int64_t v) {
  auto u = uint64_t(v);
  for (int i = 0; i < 8; ++i) buf_.push_back(uint8_t(u >> (8 * i)));
  return *this;
}

FrameWriter& FrameWriter::str(std::string_view s) {
  if (s.size() > kMaxFrameBytes)
    throw StoreError("store key or value of " + std::to_string(s.size()) + " bytes exceeds the limit of 1 GiB");
  u32(uint32_t(s.size()));
  buf_.insert(buf_.end(), s.begin(), s.end());
  return *this;
}

FrameWriter& FrameWriter::bytes(const Bytes& b) {
  return str(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
}

Bytes FrameWriter::take() && {
  size_t body = buf_.size() - 4;
  if (body > kMaxFrameBytes)
    throw StoreError("store request of " + std::to_string(body) + " bytes exceeds the limit of 1 GiB");
  for (int i = 0; i < 4; ++i) buf_[i] = uint8_t(body >> (8 * i));
  return std::move(buf_);
}

const uint8_t* FrameReader::take(size_t n) {
  if (size_t(end_ - p_) < n) throw WireError("frame ends early");
  const uint8_t* at = p_;
  p_ += n;
  return at;
}

uint8_t FrameReader::u8() { return *take(1); }

uint32_t FrameReader::u32() { return load_u32(take(4)); }

int64_t FrameReader::i64() {
  const uint8_t* p = take(8);
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= uint64_t(p[i]) << (8 * i);
  return int64_t(u);
}

std::string FrameReader::str() {
  uint32_t n = u32();
  const uint8_t* p = take(n);
  return std::string(reinterpret_cast<const char*>(p), n);
}

Bytes FrameReader::bytes() {
  uint32_t n = u32();
  const uint8_t* p = take(n);
  return Bytes(p, p + n);
}

void FrameReader::expect_end() const {
  if (p_ != end_) throw WireError("frame has " + std::to_string(end_ - p_) + " trailing bytes");
}

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message (maybe not in buf); XSI returns 0 and fills buf.
  auto r = strerror_r(err, buf, sizeof buf);
  if constexpr (std::is_same_v<decltype(r), char*>) {
    return r;
  } else {
    return r == 0 ? std::string(buf) : "error " + std::to_string(err);
  }
}

}  // namespace mt::store_detail
