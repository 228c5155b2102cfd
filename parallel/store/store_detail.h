// store_detail.h: internals shared by the store implementations (not part of the API): error-message helpers,
// the TCP wire format and socket helpers.
//
// Wire format (all integers little-endian). Every message is a frame: u32 body length, then the body.
// Strings and values are u32 length + bytes.
//   request  = u8 op, then   set: key, value | get: key, i64 timeout_ms | add: key, i64 delta
//                            check: key | wait: u32 n, n keys, i64 timeout_ms
//   response = u8 status, then
//     ok:      set: - | get: value | add: i64 new value | check: u8 present | wait: -
//     timeout: u32 n, n missing keys            (get / wait only; the server keeps the deadline)
//     error:   message string                   (e.g. add on a value that is not an integer)
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/store/store.h"

namespace mt::store_detail {

using Clock = std::chrono::steady_clock;

// "0.3 s", "12.0 s".
std::string format_seconds(Clock::duration d);
// "a, b, c and 5 more": at most `max_shown` keys.
std::string join_keys(const std::vector<std::string>& keys, size_t max_shown = 8);
// now + timeout, saturating: Millis::max() means "about forever" without overflowing the clock.
Clock::time_point deadline_after(Millis timeout);

// add() counters are decimal text.
std::optional<int64_t> parse_counter(const Bytes& value);
Bytes format_counter(int64_t value);

enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5 };
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };
inline constexpr uint32_t kMaxFrameBytes = 1u << 30;  // 1 GiB: anything larger is a protocol error

// A frame that ends early or holds a field too long.
class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds one frame; the length prefix is filled in by take().
class FrameWriter {
 public:
  FrameWriter() : buf_(4, 0) {}
  FrameWriter& u8(uint8_t v);
  FrameWriter& u32(uint32_t v);
  FrameWriter& i64(int64_t v);
  FrameWriter& str(std::string_view s);
  FrameWriter& bytes(const Bytes& b);
  Bytes take() &&;  // the whole frame, length prefix included

 private:
  Bytes buf_;
};

// Reads the fields of one frame body; throws WireError when the body ends early.
class FrameReader {
 public:
  FrameReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string str();
  Bytes bytes();
  void expect_end() const;

 private:
  const uint8_t* take(size_t n);
  const uint8_t* p_;
  const uint8_t* end_;
};

uint32_t load_u32(const uint8_t* p);

// strerror(err), thread-safe.
std::string errno_text(int err);

}  // namespace mt::store_detail
