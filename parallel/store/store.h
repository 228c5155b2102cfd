// store.h: the rendezvous key-value store. Rank 0 serves it over TCP at MASTER_ADDR:MASTER_PORT; every
// rank (rank 0 included) talks to it as a client. NCCL unique ids and Gloo addresses go through it.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

// A store operation that failed or timed out; the message names the store address, the operation, the
// key and how long it waited.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

// A store holds bytes; these spell text values in and out (rendezvous keys, names, verdicts).
inline Bytes text_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
inline std::string bytes_text(const Bytes& b) { return std::string(b.begin(), b.end()); }

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until `key` is present (or the timeout passes: StoreError).
  virtual Bytes get(const std::string& key, Millis timeout) = 0;
  // Atomically adds delta to the integer at key (absent = 0) and returns the new value. The integer is stored
  // as decimal text, so get(key) after add reads e.g. "42"; add on a value that is not an integer throws.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Blocks until every key is present (or the timeout passes: StoreError naming the missing keys).
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // True when key is present now (never blocks).
  virtual bool check(const std::string& key) = 0;
};

// In-process store (threads-as-ranks tests): get and wait block on a condition variable.
std::shared_ptr<Store> make_hash_store();

// Every key prefixed with "prefix/": one store, many groups.
std::shared_ptr<Store> make_prefix_store(std::string prefix, std::shared_ptr<Store> inner);

// Serves a store on host:port (port 0: any free port; host "" or "*": every local address) from a background
// thread until destroyed. Blocking gets and waits are parked on the server, so they never hold back other
// clients. Binding fails with StoreError naming host:port and the reason. The destructor closes every client
// connection (blocked clients get StoreError at once) and joins the thread.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// How long a client waits for the server to answer set / add / check, and how long beyond its own timeout it
// waits for the answer to get / wait, before it declares the server lost.
inline constexpr Millis kStoreIoTimeout{30'000};

// A client of a TcpStoreServer. Connecting retries every 100 ms until `connect_timeout` passes, then throws
// StoreError("cannot reach the rendezvous store at HOST:PORT after N s: ..."). Every later operation is bounded
// too: a server that closes the connection or stays silent past `io_timeout` gives StoreError("lost the
// rendezvous store at HOST:PORT during get(key): ..."), and the client stays unusable afterwards. The client is
// thread-safe; its requests are serialized, so a blocking get holds back other threads sharing the client.
std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port, Millis connect_timeout,
                                         Millis io_timeout = kStoreIoTimeout);

}  // namespace mt
