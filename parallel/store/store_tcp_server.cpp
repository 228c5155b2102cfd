// store_tcp_server.cpp: TcpStoreServer, the rendezvous store that rank 0 serves. One background thread polls the
// listening socket, a wake-up pipe and every client socket (all non-blocking). A get or wait whose keys are
// missing parks as a waiter with a deadline; each set or add answers the waiters it completes, and expired
// waiters get a timeout reply, so one blocked client never holds back another.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <map>
#include <spdlog/spdlog.h>
#include <thread>

#include "parallel/store/store.h"
#include "parallel/store/store_detail.h"

namespace mt {

using namespace store_detail;

namespace {

struct Conn {
  int fd = -1;
  Bytes in;  // bytes received, not yet handled from `in_pos` on
  size_t in_pos = 0;
  Bytes out;  // reply bytes not yet sent from `out_pos` on
  size_t out_pos = 0;
  bool waiting = false;  // a get / wait of this client is parked; its later requests wait their turn
  bool closed = false;
};

struct Waiter {
  uint64_t conn_id;
  Op op;  // kGet or kWait
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

}  // namespace

struct TcpStoreServer::Impl {
  std::string address;  // "host:port" for messages
  int port = 0;
  int listen_fd = -1;
  int wake_read = -1, wake_write = -1;  // a byte on the pipe wakes the thread to stop
  std::atomic<bool> stop{false};
  std::thread thread;

  // Owned by the thread.
  std::map<std::string, Bytes> data;
  std::map<uint64_t, Conn> conns;
  uint64_t next_conn_id = 1;
  std::vector<Waiter> waiters;
  bool unblocked = false;  // a waiter was answered: its client may have requests queued

  void run();
  void loop();
  void accept_clients();
  void read_from(Conn& c);
  void handle_requests(uint64_t id, Conn& c);
  void handle(uint64_t id, Conn& c, FrameReader r);
  void reply(Conn& c, Bytes frame);
  void flush(Conn& c);
  bool present(const std::vector<std::string>& keys) const;
  Bytes ok_reply_for(const Waiter& w) const;
  void answer_ready_waiters();
  void expire_waiters(Clock::time_point now);
  void drop_closed();
  void close_all();
};

namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

Bytes timeout_reply(const std::vector<std::string>& missing) {
  FrameWriter w;
  w.u8(uint8_t(Status::kTimeout)).u32(uint32_t(missing.size()));
  for (const auto& k : missing) w.str(k);
  return std::move(w).take();
}

Bytes error_reply(const std::string& message) {
  return std::move(FrameWriter().u8(uint8_t(Status::kError)).str(message)).take();
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.address = host + ":" + std::to_string(port);
  auto fail = [&](const std::string& what, int err) {
    close_fd(s.listen_fd);
    throw StoreError("cannot serve the rendezvous store on " + s.address + ": " + what +
                     (err ? ": " + errno_text(err) : ""));
  };
  if (port < 0 || port > 65535) fail("the port must be in 0..65535", 0);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const char* node = (host.empty() || host == "*") ? nullptr : host.c_str();
  if (int rc = getaddrinfo(node, std::to_string(port).c_str(), &hints, &found); rc != 0)
    fail(std::string("cannot resolve the host: ") + gai_strerror(rc), 0);
  int last_err = 0;
  std::string last_step = "bind";
  for (addrinfo* a = found; a && s.listen_fd < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_err = errno, last_step = "socket";
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      last_err = errno, last_step = "bind";
      ::close(fd);
      continue;
    }
    if (::listen(fd, SOMAXCONN) != 0) {
      last_err = errno, last_step = "listen";
      ::close(fd);
      continue;
    }
    s.listen_fd = fd;
  }
  freeaddrinfo(found);
  if (s.listen_fd < 0) fail(last_step, last_err);

  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (::getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) fail("getsockname", errno);
  s.port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  s.address = host + ":" + std::to_string(s.port);

  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) fail("pipe", errno);
  s.wake_read = pipe_fds[0];
  s.wake_write = pipe_fds[1];
  s.thread = std::thread([&s] { s.run(); });
}

TcpStoreServer::~TcpStoreServer() {
  Impl& s = *impl_;
  s.stop = true;
  char byte = 1;
  [[maybe_unused]] auto n = ::write(s.wake_write, &byte, 1);
  if (s.thread.joinable()) s.thread.join();
  close_fd(s.listen_fd);
  close_fd(s.wake_read);
  close_fd(s.wake_write);
}

int TcpStoreServer::port() const { return impl_->port; }

void TcpStoreServer::Impl::run() {
  try {
    loop();
  } catch (const std::exception& e) {
    // Closing every socket below makes each client fail with "lost the rendezvous store" instead of hanging.
    spdlog::error("rendezvous store at {} stopped: {}", address, e.what());
  }
  close_all();
}

void TcpStoreServer::Impl::loop() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;  // ids[i] is the connection of fds[i + 2]
  while (!stop) {
    fds.assign({{wake_read, POLLIN, 0}, {listen_fd, POLLIN, 0}});
    ids.clear();
    for (auto& [id, c] : conns) {
      fds.push_back({c.fd, short(POLLIN | (c.out_pos < c.out.size() ? POLLOUT : 0)), 0});
      ids.push_back(id);
    }
    int timeout_ms = -1;
    if (!waiters.empty()) {
      auto next = std::min_element(waiters.begin(), waiters.end(), [](const Waiter& a, const Waiter& b) {
                    return a.deadline < b.deadline;
                  })->deadline;
      auto ms = std::chrono::ceil<Millis>(next - Clock::now()).count();
      timeout_ms = int(std::clamp<int64_t>(ms, 0, INT_MAX));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("poll: " + errno_text(errno));
    }
    if (stop) break;
    if (fds[1].revents & POLLIN) accept_clients();
    for (size_t i = 0; i < ids.size(); ++i) {
      Conn& c = conns.at(ids[i]);
      short ev = fds[i + 2].revents;
      if (ev & POLLOUT) flush(c);
      if (ev & (POLLIN | POLLHUP | POLLERR)) read_from(c);
      if (!c.closed) handle_requests(ids[i], c);
    }
    expire_waiters(Clock::now());
    // Answered waiters free their clients, whose queued requests may set keys that answer other waiters.
    while (unblocked) {
      unblocked = false;
      for (auto& [id, c] : conns)
        if (!c.closed) handle_requests(id, c);
    }
    drop_closed();
  }
}

void TcpStoreServer::Impl::accept_clients() {
  while (true) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
      spdlog::warn("rendezvous store at {}: accept: {}", address, errno_text(errno));
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        std::this_thread::sleep_for(Millis(10));  // the pending connection stays queued; do not spin on it
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conns[next_conn_id++].fd = fd;
  }
}

void TcpStoreServer::Impl::read_from(Conn& c) {
  uint8_t buf[64 * 1024];
  while (true) {
    ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      c.in.insert(c.in.end(), buf, buf + n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c.closed = true;  // client gone
      return;
    }
  }
}

void TcpStoreServer::Impl::handle_requests(uint64_t id, Conn& c) {
  while (!c.waiting && !c.closed) {
    size_t avail = c.in.size() - c.in_pos;
    if (avail < 4) break;
    uint32_t len = load_u32(c.in.data() + c.in_pos);
    if (len == 0 || len > kMaxFrameBytes) {
      spdlog::warn("rendezvous store at {}: dropping a client that sent a frame of {} bytes", address, len);
      c.closed = true;
      break;
    }
    if (avail < 4 + size_t(len)) break;
    handle(id, c, FrameReader(c.in.data() + c.in_pos + 4, len));
    c.in_pos += 4 + size_t(len);
  }
  if (c.in_pos == c.in.size()) {
    c.in.clear();
    c.in_pos = 0;
  } else if (c.in_pos > (1u << 20)) {
    c.in.erase(c.in.begin(), c.in.begin() + ptrdiff_t(c.in_pos));
    c.in_pos = 0;
  }
}

void TcpStoreServer::Impl::handle(uint64_t id, Conn& c, FrameReader r) {
  try {
    auto op = Op(r.u8());
    switch (op) {
      case Op::kSet: {
        std::string key = r.str();
        Bytes value = r.bytes();
        r.expect_end();
        data[key] = std::move(value);
        reply(c, std::move(FrameWriter().u8(uint8_t(Status::kOk))).take());
        answer_ready_waiters();
        return;
      }
      case Op::kAdd: {
        std::string key = r.str();
        int64_t delta = r.i64();
        r.expect_end();
        int64_t value = delta;
        if (auto it = data.find(key); it != data.end()) {
          auto old = parse_counter(it->second);
          if (!old) return reply(c, error_reply("the value is not an integer"));
          value = *old + delta;
        }
        data[key] = format_counter(value);
        reply(c, std::move(FrameWriter().u8(uint8_t(Status::kOk)).i64(value)).take());
        answer_ready_waiters();
        return;
      }
      case Op::kCheck: {
        std::string key = r.str();
        r.expect_end();
        reply(c, std::move(FrameWriter().u8(uint8_t(Status::kOk)).u8(data.count(key) ? 1 : 0)).take());
        return;
      }
      case Op::kGet:
      case Op::kWait: {
        Waiter w{id, op, {}, {}};
        uint32_t n = op == Op::kGet ? 1 : r.u32();
        for (uint32_t i = 0; i < n; ++i) w.keys.push_back(r.str());
        int64_t timeout_ms = r.i64();
        r.expect_end();
        w.deadline = deadline_after(Millis(timeout_ms));
        if (present(w.keys)) return reply(c, ok_reply_for(w));
        c.waiting = true;
        waiters.push_back(std::move(w));
        if (timeout_ms <= 0) expire_waiters(Clock::now());
        return;
      }
    }
    reply(c, error_reply("unknown operation " + std::to_string(int(op))));
  } catch (const WireError& e) {
    reply(c, error_reply(std::string("malformed request: ") + e.what()));
  }
}

bool TcpStoreServer::Impl::present(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
}

Bytes TcpStoreServer::Impl::ok_reply_for(const Waiter& w) const {
  FrameWriter f;
  f.u8(uint8_t(Status::kOk));
  if (w.op == Op::kGet) f.bytes(data.at(w.keys[0]));
  return std::move(f).take();
}

void TcpStoreServer::Impl::answer_ready_waiters() {
  auto done = std::remove_if(waiters.begin(), waiters.end(), [&](const Waiter& w) {
    if (!present(w.keys)) return false;
    Conn& c = conns.at(w.conn_id);
    reply(c, ok_reply_for(w));
    c.waiting = false;
    unblocked = true;
    return true;
  });
  waiters.erase(done, waiters.end());
}

void TcpStoreServer::Impl::expire_waiters(Clock::time_point now) {
  auto done = std::remove_if(waiters.begin(), waiters.end(), [&](const Waiter& w) {
    if (w.deadline > now) return false;
    std::vector<std::string> missing;
    for (const auto& k : w.keys)
      if (!data.count(k)) missing.push_back(k);
    Conn& c = conns.at(w.conn_id);
    reply(c, timeout_reply(missing));
    c.waiting = false;
    unblocked = true;
    return true;
  });
  waiters.erase(done, waiters.end());
}

void TcpStoreServer::Impl::reply(Conn& c, Bytes frame) {
  if (c.closed) return;
  c.out.insert(c.out.end(), frame.begin(), frame.end());
  flush(c);
}

void TcpStoreServer::Impl::flush(Conn& c) {
  while (!c.closed && c.out_pos < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_pos += size_t(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // the rest goes when poll reports POLLOUT
    } else {
      c.closed = true;
    }
  }
  if (c.out_pos == c.out.size()) {
    c.out.clear();
    c.out_pos = 0;
  }
}

void TcpStoreServer::Impl::drop_closed() {
  for (auto it = conns.begin(); it != conns.end();) {
    if (!it->second.closed) {
      ++it;
      continue;
    }
    uint64_t id = it->first;
    std::erase_if(waiters, [id](const Waiter& w) { return w.conn_id == id; });
    close_fd(it->second.fd);
    it = conns.erase(it);
  }
}

void TcpStoreServer::Impl::close_all() {
  for (auto& [id, c] : conns) close_fd(c.fd);
  conns.clear();
  waiters.clear();
  close_fd(listen_fd);  // later connection attempts are refused rather than left unanswered
}

}  // namespace mt
