// test_store.cpp: the rendezvous store: the in-process hash store, prefixed views, and the TCP server and
// client, including every way a store operation must fail loudly instead of hanging.
#include <gtest/gtest.h>

#include "tests/unit/expect_contains.h"
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "parallel/store/store.h"

using namespace mt;
using namespace std::chrono_literals;

namespace {

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs f and returns the StoreError message it throws ("" and a test failure if it throws none).
template <class F>
std::string store_error(F f) {
  try {
    f();
  } catch (const StoreError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a StoreError";
  return "";
}

// A TCP socket bound to a free loopback port: without listen() connections are refused; with it the kernel
// accepts connections that nobody ever answers.
struct RawSocket {
  int fd = -1;
  int port = 0;
  explicit RawSocket(bool listening) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    if (listening) {
      EXPECT_EQ(::listen(fd, 16), 0);
    }
  }
  ~RawSocket() { ::close(fd); }
};

const std::string kHost = "127.0.0.1";

// The semantics every store shares, run against the hash store, a prefixed view and a TCP client.
void check_store_semantics(Store& s) {
  EXPECT_FALSE(s.check("k"));
  s.set("k", bytes("v1"));
  EXPECT_TRUE(s.check("k"));
  EXPECT_EQ(text(s.get("k", 1s)), "v1");
  s.set("k", bytes("v2"));  // set overwrites
  EXPECT_EQ(text(s.get("k", 1s)), "v2");
  s.set("empty", {});
  EXPECT_TRUE(s.get("empty", 1s).empty());

  EXPECT_EQ(s.add("n", 5), 5);  // absent counts as 0
  EXPECT_EQ(s.add("n", -2), 3);
  EXPECT_EQ(text(s.get("n", 1s)), "3");  // counters are decimal text
  EXPECT_CONTAINS(store_error([&] { s.add("k", 1); }), "not an integer");

  s.wait({"k", "n", "empty"}, 1s);
  s.wait({}, 0ms);

  auto start = std::chrono::steady_clock::now();
  std::string get_error = store_error([&] { s.get("absent", 200ms); });
  EXPECT_LT(seconds_since(start), 3.0);
  EXPECT_CONTAINS(get_error, "get(");
  EXPECT_CONTAINS(get_error, "absent");
  EXPECT_CONTAINS(get_error, "timed out after 0.");

  std::string wait_error = store_error([&] { s.wait({"k", "missing-1", "missing-2"}, 100ms); });
  EXPECT_CONTAINS(wait_error, "missing keys:");
  EXPECT_CONTAINS(wait_error, "missing-1");
  EXPECT_CONTAINS(wait_error, "missing-2");
  EXPECT_EQ(wait_error.find(", k"), std::string::npos) << wait_error;  // present keys are not listed

  s.set("after-timeouts", bytes("still usable"));
  EXPECT_EQ(text(s.get("after-timeouts", 1s)), "still usable");
}

// 8 threads x 100 increments, each thread through its own handle from make_client().
template <class MakeClient>
void check_add_is_atomic(MakeClient make_client) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      std::shared_ptr<Store> s = make_client();
      for (int i = 0; i < 100; ++i) s->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(make_client()->add("counter", 0), 800);
}

TEST(HashStore, SetGetAddWaitCheckAndTimeouts) {
  auto s = make_hash_store();
  check_store_semantics(*s);
  EXPECT_CONTAINS(store_error([&] { s->get("absent", 10ms); }), "in-process store: get(absent) timed out");
}

TEST(HashStore, GetAndWaitBlockUntilAnotherThreadSets) {
  auto s = make_hash_store();
  auto got = std::async(std::launch::async, [&] { return text(s->get("late", 10s)); });
  auto waited = std::async(std::launch::async, [&] { s->wait({"late", "later"}, 10s); });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(got.wait_for(0ms), std::future_status::timeout);
  s->set("late", bytes("here"));
  EXPECT_EQ(got.get(), "here");
  EXPECT_EQ(waited.wait_for(50ms), std::future_status::timeout);  // still missing "later"
  s->add("later", 1);
  waited.get();
}

TEST(HashStore, AddIsAtomic) {
  auto s = make_hash_store();
  check_add_is_atomic([&] { return s; });
}

TEST(PrefixStore, SemanticsAndIsolation) {
  auto inner = make_hash_store();
  auto a = make_prefix_store("group-a", inner);
  auto b = make_prefix_store("group-b", inner);
  check_store_semantics(*a);

  EXPECT_FALSE(b->check("k"));
  b->set("k", bytes("b's"));
  EXPECT_EQ(text(a->get("k", 1s)), "v2");
  EXPECT_EQ(text(b->get("k", 1s)), "b's");
  EXPECT_EQ(text(inner->get("group-a/k", 1s)), "v2");
  EXPECT_EQ(text(inner->get("group-b/k", 1s)), "b's");
  EXPECT_EQ(b->add("n", 1), 1);  // a's counter "n" is 3
  b->set("x", {});
  a->set("x", {});
  b->wait({"x"}, 1s);
  EXPECT_FALSE(inner->check("k"));

  // Prefixes nest, and errors name the full key.
  auto nested = make_prefix_store("tp0", a);
  nested->set("id", bytes("1"));
  EXPECT_TRUE(inner->check("group-a/tp0/id"));
  EXPECT_CONTAINS(store_error([&] { nested->get("nope", 1ms); }), "group-a/tp0/nope");
}

TEST(TcpStore, SemanticsThroughAClient) {
  TcpStoreServer server(kHost, 0);
  EXPECT_GT(server.port(), 0);
  auto s = connect_tcp_store(kHost, server.port(), 2s);
  check_store_semantics(*s);
  std::string get_error = store_error([&] { s->get("absent", 10ms); });
  EXPECT_CONTAINS(get_error, "rendezvous store at 127.0.0.1:" + std::to_string(server.port()));
}

TEST(TcpStore, ClientsInSeveralThreadsSeeEachOther) {
  TcpStoreServer server(kHost, 0);
  constexpr int kRanks = 6;
  auto shared = connect_tcp_store(kHost, server.port(), 2s);  // one client used by every thread as well
  std::vector<std::string> keys;
  for (int r = 0; r < kRanks; ++r) keys.push_back("rank/" + std::to_string(r));
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto own = connect_tcp_store(kHost, server.port(), 2s);
      shared->set("shared/" + std::to_string(r), bytes(std::to_string(r)));
      own->set(keys[r], bytes("addr-" + std::to_string(r)));
      own->wait(keys, 5s);  // a barrier: every rank's key is in, so every shared key too
      bool all = true;
      for (int q = 0; q < kRanks; ++q) {
        all = all && text(own->get(keys[q], 1s)) == "addr-" + std::to_string(q);
        all = all && shared->check("shared/" + std::to_string(q));
      }
      if (all) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, kRanks);
}

TEST(TcpStore, GetBlocksUntilAnotherClientSetsWithoutBlockingOthers) {
  TcpStoreServer server(kHost, 0);
  auto waiter = connect_tcp_store(kHost, server.port(), 2s);
  auto setter = connect_tcp_store(kHost, server.port(), 2s);
  auto got = std::async(std::launch::async, [&] { return text(waiter->get("nccl-id", 10s)); });
  auto waited = std::async(std::launch::async, [&] {
    connect_tcp_store(kHost, server.port(), 2s)->wait({"nccl-id", "gloo-addr"}, 10s);
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(got.wait_for(0ms), std::future_status::timeout);
  // The parked get and wait hold back nobody else.
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(setter->check("nccl-id"));
  setter->set("nccl-id", bytes("unique-id"));
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_EQ(got.get(), "unique-id");
  EXPECT_EQ(waited.wait_for(50ms), std::future_status::timeout);
  setter->add("gloo-addr", 1);
  waited.get();
}

TEST(TcpStore, AddIsAtomic) {
  TcpStoreServer server(kHost, 0);
  check_add_is_atomic([&] { return connect_tcp_store(kHost, server.port(), 2s); });
  auto shared = connect_tcp_store(kHost, server.port(), 2s);
  check_add_is_atomic([&] { return make_prefix_store("shared", shared); });  // one client, 8 threads
}

TEST(TcpStore, LargeValuesRoundTrip) {
  TcpStoreServer server(kHost, 0);
  auto a = connect_tcp_store(kHost, server.port(), 2s);
  auto b = connect_tcp_store(kHost, server.port(), 2s);
  Bytes big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 2654435761u >> 13);
  auto got = std::async(std::launch::async, [&] { return b->get("big", 10s); });  // answered by the set
  a->set("big", big);
  EXPECT_EQ(got.get(), big);
  EXPECT_EQ(a->get("big", 1s), big);
  std::string long_key(10000, 'k');
  a->set(long_key, bytes("v"));
  EXPECT_TRUE(b->check(long_key));
}

TEST(TcpStore, ConnectFailsWithinTheTimeoutNamingTheAddress) {
  RawSocket nobody(/*listening=*/false);  // holds the port, refuses connections
  auto start = std::chrono::steady_clock::now();
  std::string error = store_error([&] { connect_tcp_store(kHost, nobody.port, 300ms); });
  double took = seconds_since(start);
  EXPECT_GE(took, 0.25);  // it retried until the timeout...
  EXPECT_LT(took, 3.0);   // ...and not much longer
  EXPECT_CONTAINS(error, "cannot reach the rendezvous store at 127.0.0.1:" + std::to_string(nobody.port) + " after");
  EXPECT_CONTAINS(error, "refused");

  EXPECT_CONTAINS(store_error([&] { connect_tcp_store(kHost, 0, 100ms); }), "port");
}

TEST(TcpStore, ConnectRetriesUntilTheServerComesUp) {
  RawSocket reserved(/*listening=*/false);
  int port = reserved.port;
  std::unique_ptr<TcpStoreServer> server;
  auto client = std::async(std::launch::async, [&] { return connect_tcp_store(kHost, port, 5s); });
  std::this_thread::sleep_for(150ms);
  ::close(reserved.fd);
  reserved.fd = ::socket(AF_INET, SOCK_STREAM, 0);  // for the destructor
  server = std::make_unique<TcpStoreServer>(kHost, port);
  auto s = client.get();
  s->set("up", bytes("yes"));
  EXPECT_EQ(text(s->get("up", 1s)), "yes");
}

TEST(TcpStore, ServerDestroyedWhileAClientWaits) {
  auto server = std::make_unique<TcpStoreServer>(kHost, 0);
  int port = server->port();
  std::string address = "127.0.0.1:" + std::to_string(port);
  auto s = connect_tcp_store(kHost, server->port(), 2s);
  auto idle = connect_tcp_store(kHost, server->port(), 2s);
  s->set("k", bytes("v"));
  auto blocked = std::async(std::launch::async, [&] { return store_error([&] { s->get("never", 60s); }); });
  std::this_thread::sleep_for(100ms);
  auto start = std::chrono::steady_clock::now();
  server.reset();  // prompt even with connected clients
  EXPECT_LT(seconds_since(start), 1.0);
  ASSERT_EQ(blocked.wait_for(3s), std::future_status::ready) << "the client hangs after the server is gone";
  std::string error = blocked.get();
  EXPECT_CONTAINS(error, "lost the rendezvous store at " + address + " during get(never)");
  // Later calls fail at once, on this client and on one that was idle.
  EXPECT_CONTAINS(store_error([&] { s->set("k", bytes("v")); }), "lost the rendezvous store at " + address);
  EXPECT_CONTAINS(store_error([&] { idle->add("k", 1); }), "lost the rendezvous store at " + address);
  EXPECT_CONTAINS(store_error([&] { connect_tcp_store(kHost, port, 100ms); }), "cannot reach");
}

TEST(TcpStore, SilentServerIsLostAfterTheIoTimeout) {
  RawSocket silent(/*listening=*/true);  // the kernel completes the handshake; nobody ever answers
  auto s = connect_tcp_store(kHost, silent.port, 1s, /*io_timeout=*/300ms);
  auto start = std::chrono::steady_clock::now();
  std::string error = store_error([&] { s->set("k", bytes("v")); });
  EXPECT_LT(seconds_since(start), 3.0);
  EXPECT_CONTAINS(error, "lost the rendezvous store at 127.0.0.1:" + std::to_string(silent.port) + " during set(k)");
  EXPECT_CONTAINS(error, "no answer after");
}

TEST(TcpStore, BindingAPortInUseFailsClearly) {
  TcpStoreServer first(kHost, 0);
  std::string error = store_error([&] { TcpStoreServer second(kHost, first.port()); });
  EXPECT_CONTAINS(error, "127.0.0.1:" + std::to_string(first.port()));
  EXPECT_CONTAINS(error, "Address already in use");
  EXPECT_CONTAINS(store_error([&] { TcpStoreServer bad(kHost, 70000); }), "127.0.0.1:70000");
  // The first server still works.
  auto s = connect_tcp_store(kHost, first.port(), 2s);
  s->set("k", bytes("v"));
  EXPECT_TRUE(s->check("k"));
}

}  // namespace
