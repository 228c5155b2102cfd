// store_tcp_client.cpp: the client side of the rendezvous store. Connecting retries until its timeout; every
// request after that is bounded by a deadline (poll on a non-blocking socket), so a dead or silent server turns
// into a StoreError naming the address and the operation, never a hang or a SIGPIPE.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <mutex>
#include <thread>

#include "parallel/store/store.h"
#include "parallel/store/store_detail.h"

namespace mt {

using namespace store_detail;

namespace {

int poll_ms_until(Clock::time_point deadline) {
  auto ms = std::chrono::ceil<Millis>(deadline - Clock::now()).count();
  return int(std::clamp<int64_t>(ms, 0, INT_MAX));
}

// Waits for `events` on fd until the deadline: 1 ready, 0 timed out, -1 error (errno set).
int wait_for(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, poll_ms_until(deadline));
    if (rc < 0 && errno == EINTR) continue;
    return rc;
  }
}

// One connection attempt to every address of host:port; returns the connected socket or -1 with `error` set.
int try_connect(const std::string& host, int port, Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    error = std::string("cannot resolve the host: ") + gai_strerror(rc);
    return -1;
  }
  int result = -1;
  for (addrinfo* a = found; a && result < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = errno_text(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        int rc = wait_for(fd, POLLOUT, deadline);
        socklen_t len = sizeof err;
        if (rc == 0)
          err = ETIMEDOUT;
        else if (rc < 0)
          err = errno;
        else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
          err = errno;
      }
    }
    if (err != 0) {
      error = errno_text(err);
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    result = fd;
  }
  freeaddrinfo(found);
  return result;
}

class TcpStoreClient final : public Store {
 public:
  TcpStoreClient(std::string address, int fd, Millis io_timeout)
      : address_(std::move(address)), fd_(fd), io_timeout_(io_timeout) {}
  ~TcpStoreClient() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void set(const std::string& key, const Bytes& value) override {
    std::string what = "set(" + key + ")";
    Bytes frame = std::move(FrameWriter().u8(uint8_t(Op::kSet)).str(key).bytes(value)).take();
    std::lock_guard lock(mu_);
    Bytes reply = request(what, frame, deadline_after(io_timeout_));
    FrameReader r = open_reply(what, reply, Status::kOk);
    finish(what, r);
  }

  Bytes get(const std::string& key, Millis timeout) override {
    std::string what = "get(" + key + ")";
    Bytes frame = std::move(FrameWriter().u8(uint8_t(Op::kGet)).str(key).i64(wire_timeout(timeout))).take();
    std::lock_guard lock(mu_);
    auto start = Clock::now();
    Bytes reply = request(what, frame, deadline_after(timeout) + io_timeout_);
    FrameReader r = open_reply(what, reply, Status::kTimeout);
    if (Status(reply[0]) == Status::kTimeout)
      throw StoreError("rendezvous store at " + address_ + ": " + what + " timed out after " +
                       format_seconds(Clock::now() - start));
    Bytes value = field(what, [&] { return r.bytes(); });
    finish(what, r);
    return value;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    std::string what = "add(" + key + ")";
    Bytes frame = std::move(FrameWriter().u8(uint8_t(Op::kAdd)).str(key).i64(delta)).take();
    std::lock_guard lock(mu_);
    Bytes reply = request(what, frame, deadline_after(io_timeout_));
    FrameReader r = open_reply(what, reply, Status::kOk);
    int64_t value = field(what, [&] { return r.i64(); });
    finish(what, r);
    return value;
  }

  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    std::string what = "wait(" + join_keys(keys, 3) + ")";
    FrameWriter w;
    w.u8(uint8_t(Op::kWait)).u32(uint32_t(keys.size()));
    for (const auto& k : keys) w.str(k);
    Bytes frame = std::move(w.i64(wire_timeout(timeout))).take();
    std::lock_guard lock(mu_);
    auto start = Clock::now();
    Bytes reply = request(what, frame, deadline_after(timeout) + io_timeout_);
    FrameReader r = open_reply(what, reply, Status::kTimeout);
    if (Status(reply[0]) == Status::kTimeout) {
      std::vector<std::string> missing = field(what, [&] {
        std::vector<std::string> out(r.u32());
        for (auto& k : out) k = r.str();
        return out;
      });
      throw StoreError("rendezvous store at " + address_ + ": wait for " + std::to_string(keys.size()) +
                       " keys timed out after " + format_seconds(Clock::now() - start) +
                       "; missing keys: " + join_keys(missing));
    }
    finish(what, r);
  }

  bool check(const std::string& key) override {
    std::string what = "check(" + key + ")";
    Bytes frame = std::move(FrameWriter().u8(uint8_t(Op::kCheck)).str(key)).take();
    std::lock_guard lock(mu_);
    Bytes reply = request(what, frame, deadline_after(io_timeout_));
    FrameReader r = open_reply(what, reply, Status::kOk);
    bool present = field(what, [&] { return r.u8() != 0; });
    finish(what, r);
    return present;
  }

 private:
  static int64_t wire_timeout(Millis timeout) {
    return std::max<int64_t>(0, std::chrono::duration_cast<Millis>(timeout).count());
  }

  // Sends one request frame and returns the reply body. Holds mu_. On any failure the connection is closed and
  // every later call fails too: after a lost reply, request and reply could no longer be matched.
  Bytes request(const std::string& what, const Bytes& frame, Clock::time_point deadline) {
    if (fd_ < 0) throw StoreError("lost the rendezvous store at " + address_ + " during " + what + ": " + lost_);
    auto start = Clock::now();
    std::string why;
    size_t sent = 0;
    while (why.empty() && sent < frame.size()) {
      ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n > 0)
        sent += size_t(n);
      else if (n < 0 && errno == EINTR)
        continue;
      else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        why = await(POLLOUT, deadline, start);
      else
        why = errno_text(errno);
    }
    uint8_t head[4];
    if (why.empty()) why = receive(head, 4, deadline, start);
    Bytes body;
    if (why.empty()) {
      uint32_t len = load_u32(head);
      if (len == 0 || len > kMaxFrameBytes)
        why = "malformed reply (frame of " + std::to_string(len) + " bytes)";
      else
        body.resize(len);
    }
    if (why.empty()) why = receive(body.data(), body.size(), deadline, start);
    if (!why.empty()) fail(what, why);
    return body;
  }

  // Receives exactly n bytes before the deadline; "" or why it failed.
  std::string receive(uint8_t* p, size_t n, Clock::time_point deadline, Clock::time_point start) {
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::recv(fd_, p + got, n - got, 0);
      if (r > 0)
        got += size_t(r);
      else if (r == 0)
        return "the server closed the connection";
      else if (errno == EINTR)
        continue;
      else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (std::string why = await(POLLIN, deadline, start); !why.empty()) return why;
      } else {
        return errno_text(errno);
      }
    }
    return "";
  }

  std::string await(short events, Clock::time_point deadline, Clock::time_point start) {
    int rc = wait_for(fd_, events, deadline);
    if (rc > 0) return "";
    if (rc == 0) return "no answer after " + format_seconds(Clock::now() - start);
    return errno_text(errno);
  }

  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    ::close(fd_);
    fd_ = -1;
    lost_ = "the connection was lost earlier, during " + what + ": " + why;
    throw StoreError("lost the rendezvous store at " + address_ + " during " + what + ": " + why);
  }

  // Reads the status byte; kError throws with the server's message. `allowed` is the one status besides kOk
  // that the caller handles itself.
  FrameReader open_reply(const std::string& what, const Bytes& reply, Status allowed) {
    FrameReader r(reply.data(), reply.size());
    auto status = Status(r.u8());
    if (status == Status::kOk || status == allowed) return r;
    if (status == Status::kError) {
      std::string message = field(what, [&] { return r.str(); });
      throw StoreError("rendezvous store at " + address_ + ": " + what + " failed: " + message);
    }
    fail(what, "malformed reply (status " + std::to_string(int(status)) + ")");
  }

  template <class F>
  auto field(const std::string& what, F read) -> decltype(read()) {
    try {
      return read();
    } catch (const WireError& e) {
      fail(what, std::string("malformed reply: ") + e.what());
    }
  }

  void finish(const std::string& what, const FrameReader& r) {
    field(what, [&] {
      r.expect_end();
      return 0;
    });
  }

  std::mutex mu_;  // one request / reply at a time
  std::string address_;
  int fd_;            // -1 once the connection is lost
  std::string lost_;  // when and why, for the calls after that
  Millis io_timeout_;
};

}  // namespace

std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port, Millis connect_timeout, Millis io_timeout) {
  std::string address = host + ":" + std::to_string(port);
  if (port <= 0 || port > 65535)
    throw StoreError("cannot reach the rendezvous store at " + address + ": the port must be in 1..65535");
  auto start = Clock::now();
  auto deadline = deadline_after(connect_timeout);
  std::string error;
  while (true) {
    int fd = try_connect(host, port, deadline, error);
    if (fd >= 0) return std::make_shared<TcpStoreClient>(address, fd, io_timeout);
    auto now = Clock::now();
    if (now >= deadline)
      throw StoreError("cannot reach the rendezvous store at " + address + " after " + format_seconds(now - start) +
                       ": " + error);
    std::this_thread::sleep_for(std::min<Clock::duration>(Millis(100), deadline - now));
  }
}

}  // namespace mt
