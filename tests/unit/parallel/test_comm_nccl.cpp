// test_comm_nccl.cpp: the NCCL communicator. NCCL refuses two ranks of one communicator on one GPU, so the
// device tests use a one-rank group; the multi-rank behaviour (send/recv batches, timeouts, aborts) is
// checked on several GPUs by the end-to-end runs. Most tests use device buffers from cudaMalloc through the
// nccl_raw entry points; the staged-communicator test uses CUDA tensors.
#include <gtest/gtest.h>

#ifndef MEGATRAIN_WITH_NCCL

TEST(CommNccl, Skipped) { GTEST_SKIP() << "built without NCCL"; }

#else

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda/runtime.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/thread_ranks.h"

namespace mt {
namespace {

using namespace std::chrono_literals;
using nccl_raw::DeviceBuffer;

// "" when a CUDA device is usable, else why not (the message of the skip).
std::string no_cuda_device() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (count == 0) return "no CUDA device: cudaGetDeviceCount found none";
  return "";
}

#define SKIP_WITHOUT_CUDA_DEVICE()                          \
  do {                                                      \
    if (std::string why = no_cuda_device(); !why.empty()) { \
      GTEST_SKIP() << why;                                  \
    }                                                       \
  } while (0)

void expect_cuda(cudaError_t e, const char* call) {
  ASSERT_EQ(e, cudaSuccess) << call << ": " << cudaGetErrorString(e);
}

// n floats of device memory, freed at scope exit.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n) : n_(n) {
    expect_cuda(cudaMalloc(&ptr_, n * sizeof(float)), "cudaMalloc");
    expect_cuda(cudaMemset(ptr_, 0xff, n * sizeof(float)), "cudaMemset");  // NaNs: a skipped copy shows
  }
  ~DeviceFloats() { cudaFree(ptr_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  DeviceBuffer buffer(DType dtype = DType::f32) const {
    return {ptr_, static_cast<int64_t>(n_ * sizeof(float) / dtype_size(dtype)), dtype};
  }
  // The copies run on the legacy stream, which does not order itself with the (non-blocking) compute and
  // communication streams: finish the upload before any op, and let the compute stream (which Work::wait()
  // orders after the op) finish before downloading.
  void upload(const std::vector<float>& v) {
    ASSERT_EQ(v.size(), n_);
    expect_cuda(cudaMemcpy(ptr_, v.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    expect_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::vector<float> download() const {
    cuda::synchronize();
    std::vector<float> v(n_);
    expect_cuda(cudaMemcpy(v.data(), ptr_, n_ * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }

 private:
  void* ptr_ = nullptr;
  size_t n_;
};

NcclOptions one_rank(const std::string& name) {
  NcclOptions opt;
  opt.name = name;
  opt.members = {0};
  opt.global_rank = 0;
  opt.device = 0;
  opt.timeout = 60s;
  return opt;
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (static_cast<float>(i) - 7.f);
  return v;
}

template <class F>
std::string comm_error_of(F&& f) {
  try {
    f();
  } catch (const CommError& e) {
    return e.what();
  }
  return "(no CommError)";
}

// Misuse is caught before any CUDA call, so these run on every machine.
TEST(CommNccl, RejectsBadOptionsWithoutADevice) {
  auto store = make_hash_store();
  NcclOptions opt = one_rank("tp[0]");
  opt.global_rank = 3;
  EXPECT_NE(comm_error_of([&] { make_nccl_communicator(store, opt); }).find("tp[0]: rank 3 is not a member"),
            std::string::npos);
  opt = one_rank("");
  opt.members = {2, 1};
  opt.global_rank = 1;
  EXPECT_NE(comm_error_of([&] { make_nccl_communicator(store, opt); }).find("nccl[2,1]: members [2, 1] must be"),
            std::string::npos);
  opt = one_rank("g");
  opt.timeout = 0ms;
  EXPECT_NE(comm_error_of([&] { make_nccl_communicator(store, opt); }).find("timeout must be positive"),
            std::string::npos);
  opt = one_rank("g");
  opt.device = -1;
  EXPECT_NE(comm_error_of([&] { make_nccl_communicator(store, opt); }).find("CUDA device -1"), std::string::npos);
  EXPECT_NE(comm_error_of([&] { make_nccl_communicator(nullptr, one_rank("g")); }).find("no rendezvous store"),
            std::string::npos);
}

// A non-first member waits for the first one's NCCL id before touching the device, so this runs anywhere too.
TEST(CommNccl, RendezvousNamesTheFirstMemberThatNeverPublished) {
  NcclOptions opt = one_rank("dp[4,6]");
  opt.members = {4, 6};
  opt.global_rank = 6;
  opt.timeout = 200ms;
  std::string what = comm_error_of([&] { make_nccl_communicator(make_hash_store(), opt); });
  EXPECT_NE(what.find("dp[4,6]: rendezvous timed out after 0.2 s on rank 1 (global 6)"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 0 (global 4) never published the NCCL id"), std::string::npos) << what;
}

TEST(CommNccl, OneRankCollectivesRoundTripOnDeviceBuffers) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto comm = make_nccl_communicator(make_hash_store(), one_rank("solo"));
  ASSERT_EQ(comm->size(), 1);
  ASSERT_EQ(comm->rank(), 0);
  const size_t n = 64;
  const std::vector<float> values = ramp(n, 0.5f);

  DeviceFloats a(n), b(n);
  a.upload(values);
  nccl_raw::all_reduce(*comm, a.buffer(), ReduceOp::sum)->wait();
  EXPECT_EQ(a.download(), values);
  nccl_raw::all_reduce(*comm, a.buffer(), ReduceOp::max)->wait();
  EXPECT_EQ(a.download(), values);

  nccl_raw::all_gather(*comm, a.buffer(), b.buffer())->wait();  // b starts as NaNs
  EXPECT_EQ(b.download(), values);
  DeviceFloats c(n);
  nccl_raw::reduce_scatter(*comm, a.buffer(), c.buffer())->wait();
  EXPECT_EQ(c.download(), values);
  nccl_raw::broadcast(*comm, c.buffer(), 0)->wait();
  EXPECT_EQ(c.download(), values);
  comm->barrier();

  // Several ops in flight at once complete in order; waiting twice is fine.
  auto w1 = nccl_raw::all_reduce(*comm, a.buffer(), ReduceOp::sum);
  auto w2 = nccl_raw::all_gather(*comm, a.buffer(), b.buffer());
  w2->wait();
  w1->wait();
  w1->wait();
  EXPECT_EQ(b.download(), values);
}

TEST(CommNccl, SixteenBitReductionsKeepTheirBits) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto comm = make_nccl_communicator(make_hash_store(), one_rank("solo16"));
  const size_t n = 32;                             // floats, so 64 half-precision elements
  const std::vector<float> values = ramp(n, 1.f);  // any bits: a one-rank sum keeps every element
  for (DType t : {DType::bf16, DType::f16}) {
    DeviceFloats a(n);
    a.upload(values);
    nccl_raw::all_reduce(*comm, a.buffer(t), ReduceOp::sum)->wait();
    std::vector<float> got = a.download();
    EXPECT_EQ(std::memcmp(got.data(), values.data(), n * sizeof(float)), 0) << dtype_name(t);
  }
}

TEST(CommNccl, MisuseNamesTheGroupAndTheOp) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto comm = make_nccl_communicator(make_hash_store(), one_rank("tp[0]"));
  Tensor host = Tensor::zeros({4}, DType::f32);
  std::string what = comm_error_of([&] { comm->all_reduce(host, ReduceOp::sum); });
  EXPECT_NE(what.find("tp[0]: all_reduce on rank 0 (global 0): NCCL moves CUDA tensors only, got a cpu tensor"),
            std::string::npos)
      << what;
  EXPECT_EQ(comm_error_of([&] { comm->barrier(); }), "(no CommError)");  // misuse does not break the communicator

  std::vector<float> on_host(8);
  what = comm_error_of([&] { nccl_raw::all_reduce(*comm, {on_host.data(), 8, DType::f32}, ReduceOp::sum); });
  EXPECT_NE(what.find("is not CUDA device memory"), std::string::npos) << what;

  DeviceFloats a(8), b(4);
  what = comm_error_of([&] { nccl_raw::reduce_scatter(*comm, a.buffer(), b.buffer()); });
  EXPECT_NE(what.find("tp[0]: reduce_scatter"), std::string::npos) << what;
  EXPECT_NE(what.find("is not 1 blocks of output"), std::string::npos) << what;
  what = comm_error_of([&] { nccl_raw::broadcast(*comm, a.buffer(), 1); });
  EXPECT_NE(what.find("root 1 is outside the group of 1"), std::string::npos) << what;
  what = comm_error_of([&] { nccl_raw::send(*comm, a.buffer(), 0, 0); });
  EXPECT_NE(what.find("peer 0 is not another rank"), std::string::npos) << what;
  what = comm_error_of([&] { nccl_raw::all_reduce(*comm, a.buffer(DType::f32), ReduceOp::sum)->wait(); });
  EXPECT_EQ(what, "(no CommError)");
}

TEST(CommNccl, CreatingAGroupAgainGetsAFreshId) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto store = make_hash_store();
  auto first = make_nccl_communicator(store, one_rank("pp"));
  auto second = make_nccl_communicator(store, one_rank("pp"));
  EXPECT_TRUE(store->check("nccl/pp/1/id"));
  EXPECT_TRUE(store->check("nccl/pp/2/id"));
  EXPECT_NE(store->get("nccl/pp/1/id", 1s), store->get("nccl/pp/2/id", 1s));
  DeviceFloats a(16);
  a.upload(ramp(16, 2.f));
  nccl_raw::all_reduce(*first, a.buffer(), ReduceOp::sum)->wait();
  nccl_raw::all_reduce(*second, a.buffer(), ReduceOp::sum)->wait();
  EXPECT_EQ(a.download(), ramp(16, 2.f));
}

// A group split off the world communicator (ncclCommSplit) works like a bootstrapped one, and a rank that
// joins no group of a split takes part and gets no communicator.
TEST(CommNccl, SplitOffTheWorldCommunicator) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto world = make_nccl_communicator(make_hash_store(), one_rank("world[0]"));
  auto tp = split_nccl_communicator(*world, one_rank("tp[0]"));
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->name(), "tp[0]");
  EXPECT_EQ(tp->size(), 1);
  NcclOptions none = one_rank("");
  none.members = {};
  EXPECT_EQ(split_nccl_communicator(*world, none), nullptr);
  const size_t n = 16;
  const std::vector<float> values = ramp(n, 0.25f);
  DeviceFloats a(n);
  a.upload(values);
  nccl_raw::all_reduce(*tp, a.buffer(), ReduceOp::sum)->wait();
  EXPECT_EQ(a.download(), values);
}

// What init_distributed does: the world communicator is a staged wrapper around NCCL (so that it takes the
// trainer's host tensors too), and every group is split off it. Splitting must look through the wrapper.
TEST(CommNccl, SplitOffAStagedWorldCommunicator) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto world = make_staged_communicator(make_nccl_communicator(make_hash_store(), one_rank("world[0]")), Device::cuda);
  auto tp = split_nccl_communicator(*world, one_rank("tp[0]"));
  ASSERT_NE(tp, nullptr);
  auto dp = split_nccl_communicator(*world, one_rank("dp[0]"));  // the parent is usable after the first split
  ASSERT_NE(dp, nullptr);
  const std::vector<float> values = ramp(16, 0.5f);
  DeviceFloats a(16);
  a.upload(values);
  nccl_raw::all_reduce(*make_staged_communicator(std::move(tp), Device::cuda), a.buffer(), ReduceOp::sum)->wait();
  nccl_raw::all_reduce(*dp, a.buffer(), ReduceOp::sum)->wait();
  EXPECT_EQ(a.download(), values);
  world->barrier();
}

// Work::wait() orders the compute stream after the op instead of blocking the host; a host read through the
// compute stream (Tensor::to_floats) then sees the result. Many ops in flight without waiting stay correct.
TEST(CommNccl, WaitOrdersTheComputeStreamAndHostReadsSeeTheResult) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto comm = make_nccl_communicator(make_hash_store(), one_rank("ordered"));
  const std::vector<float> values = ramp(1 << 16, 0.125f);
  Tensor t = Tensor::from_floats(values, {1 << 16}).to(Device::cuda);
  std::vector<std::unique_ptr<Work> > works;
  for (int i = 0; i < 16; ++i) works.push_back(comm->all_reduce(t, ReduceOp::sum));
  for (auto& w : works) w->wait();
  EXPECT_EQ(t.to_floats(), values);
  // A tensor freed while its op may still run keeps its block out of the cache until the op is done.
  {
    Tensor scratch = Tensor::from_floats(values, {1 << 16}).to(Device::cuda);
    comm->all_reduce(scratch, ReduceOp::sum);  // not waited, dropped
  }
  Tensor next = Tensor::zeros({1 << 16}, DType::f32, Device::cuda);
  comm->barrier();
  EXPECT_EQ(next.to_floats(), std::vector<float>(1 << 16, 0.f));
}

// Blocks the compute stream until release(): a host function enqueued on it spins on a flag.
class StreamGate {
 public:
  StreamGate() {
    expect_cuda(cudaLaunchHostFunc(static_cast<cudaStream_t>(cuda::compute_stream()), &StreamGate::hold, &open_),
                "cudaLaunchHostFunc");
  }
  ~StreamGate() { release(); }
  void release() { open_.store(true); }

 private:
  static void hold(void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::atomic<bool> open_{false};
};

// wait() must not block the host: with the compute stream held back (so the op, ordered after it, cannot
// run), posting and waiting still return; the result is there once the stream moves on. The gate opens only
// after wait() has returned, so a wait that polled the host for completion would time out (CommError).
TEST(CommNccl, WaitDoesNotBlockTheHost) {
  SKIP_WITHOUT_CUDA_DEVICE();
  NcclOptions opt = one_rank("nonblocking");
  opt.timeout = 20s;
  auto comm = make_nccl_communicator(make_hash_store(), opt);
  const std::vector<float> values = ramp(1024, 3.f);
  Tensor t = Tensor::from_floats(values, {1024}).to(Device::cuda);
  StreamGate gate;
  comm->all_reduce(t, ReduceOp::sum)->wait();
  gate.release();
  EXPECT_EQ(t.to_floats(), values);
}

#if defined(MEGATRAIN_WITH_CUDA)
// Staged communicators take tensors on either device: NCCL copies host tensors through the GPU, Gloo copies
// device tensors through the host; results land back where the caller's tensor lives.
TEST(CommNccl, StagedCommunicatorsTakeTensorsOnEitherDevice) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto store = make_hash_store();
  auto nccl = make_staged_communicator(make_nccl_communicator(store, one_rank("staged")), Device::cuda);
  auto gloo = make_staged_communicator(
      make_gloo_communicator(store, GlooOptions{.name = "g", .members = {0}, .global_rank = 0}), Device::cpu);
  const std::vector<float> values = ramp(12, 1.5f);
  for (Communicator* comm : {nccl.get(), gloo.get()}) {
    for (Device d : {Device::cpu, Device::cuda}) {
      Tensor t = Tensor::from_floats(values, {12}).to(d);
      comm->all_reduce(t, ReduceOp::sum)->wait();
      EXPECT_EQ(t.to_floats(), values) << comm->name() << " " << device_name(d);
      Tensor out = Tensor::zeros({12}, DType::f32).to(d);
      comm->all_gather(t, out)->wait();
      EXPECT_EQ(out.to_floats(), values) << comm->name() << " " << device_name(d);
    }
  }
}

Tensor host_tensor(const std::vector<float>& v, DType t) {
  const auto n = static_cast<int64_t>(v.size());
  if (t != DType::i32) return Tensor::from_floats(v, {n}, t);
  return Tensor::from_ints(std::vector<int32_t>(v.begin(), v.end()), {n});
}

// all_to_all on one GPU: NCCL's one-rank group (its rank's block goes to itself through ncclSend/ncclRecv) on
// every dtype, host tensors through the staged wrapper (a local copy), and exchange_counts. Elements past the
// counts stay untouched.
TEST(CommNccl, OneRankAllToAllCopiesTheCountedElementsOnEitherDevice) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto store = make_hash_store();
  auto nccl = make_staged_communicator(make_nccl_communicator(store, one_rank("a2a")), Device::cuda);
  EXPECT_EQ(exchange_counts(*nccl, {6}), (std::vector<int64_t>{6}));
  const std::vector<float> values{1, 2, 3, 4, 5, 6, 7, 8};
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32})
    for (Device d : {Device::cuda, Device::cpu}) {
      Tensor in = host_tensor(values, t).to(d);
      Tensor out = host_tensor(std::vector<float>(9, -1.f), t).to(d);
      nccl->all_to_all(in, {6}, out, {6})->wait();
      EXPECT_EQ(out.to_floats(), (std::vector<float>{1, 2, 3, 4, 5, 6, -1, -1, -1}))
          << dtype_name(t) << " " << device_name(d);
      Tensor empty_in = Tensor::zeros({2}, t, d);
      nccl->all_to_all(empty_in, {0}, out, {0})->wait();  // nothing moves
    }
  // The communicator itself (not the staged wrapper) refuses host tensors, naming the op.
  auto bare = make_nccl_communicator(store, one_rank("bare"));
  Tensor host = Tensor::zeros({4}, DType::f32);
  EXPECT_NE(comm_error_of([&] { bare->all_to_all(host, {4}, host, {4}); }).find("bare: all_to_all on rank 0"),
            std::string::npos);
  Tensor dev = Tensor::zeros({4}, DType::f32, Device::cuda);
  EXPECT_THROW(bare->all_to_all(dev, {4, 0}, dev, {4}), std::invalid_argument);
  EXPECT_NE(comm_error_of([&] { bare->all_to_all(dev, {5}, dev, {5}); }).find("send counts [5] sum to 5"),
            std::string::npos);
}

// Gloo ranks sharing one GPU (NCCL refuses that) stage CUDA tensors through the host: uneven blocks, an empty
// one, and a round trip back.
TEST(CommNccl, GlooStagedAllToAllOfCudaTensorsAmongThreadRanks) {
  SKIP_WITHOUT_CUDA_DEVICE();
  constexpr int kWorld = 3;
  auto store = make_hash_store();
  // rank `from` sends rank `to` count(from, to) elements; rank 1 sends rank 2 nothing.
  auto count = [](int from, int to) -> int64_t { return from == 1 && to == 2 ? 0 : 2 + from + 2 * to; };
  auto value = [](int from, int to, int64_t i) { return static_cast<float>(from * 100 + to * 10 + i); };
  run_ranks(kWorld, [&](int r) {
    cuda::current_device();  // bind this thread to the device
    auto comm = make_staged_communicator(join_gloo(store, "ep", first_ranks(kWorld), r), Device::cpu);
    std::vector<int64_t> send;
    std::vector<float> mine;
    for (int q = 0; q < kWorld; ++q) {
      send.push_back(count(r, q));
      for (int64_t i = 0; i < count(r, q); ++i) mine.push_back(value(r, q, i));
    }
    const std::vector<int64_t> recv = exchange_counts(*comm, send);
    std::vector<float> expected;
    for (int q = 0; q < kWorld; ++q) {
      ASSERT_EQ(recv[static_cast<size_t>(q)], count(q, r));
      for (int64_t i = 0; i < count(q, r); ++i) expected.push_back(value(q, r, i));
    }
    const auto n_in = static_cast<int64_t>(mine.size()), n_out = static_cast<int64_t>(expected.size());
    Tensor in = Tensor::from_floats(mine, {n_in}, DType::bf16).to(Device::cuda);
    Tensor out = Tensor::zeros({n_out + 3}, DType::bf16, Device::cuda);
    comm->all_to_all(in, send, out, recv)->wait();
    expected.insert(expected.end(), 3, 0.f);
    EXPECT_EQ(out.to_floats(), expected) << "rank " << r;
    Tensor back = Tensor::zeros({n_in}, DType::bf16, Device::cuda);
    comm->all_to_all(out, recv, back, send)->wait();
    EXPECT_EQ(back.to_floats(), in.to_floats()) << "rank " << r;
  });
}
#endif

}  // namespace
}  // namespace mt

#endif  // MEGATRAIN_WITH_NCCL
