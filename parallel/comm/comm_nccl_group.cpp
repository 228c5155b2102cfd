// comm_nccl_group.cpp: an NCCL group's setup and teardown: make_nccl_communicator (the NCCL id's rendezvous, then
// init) and split_nccl_communicator, the stream, event and scratch every group owns, and the closing of the
// communicator. Its ops are comm_nccl.cpp's.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "parallel/comm/comm_nccl_detail.h"

namespace mt::nccl_detail {

NcclGroup::~NcclGroup() {
  Watchdog::instance().remove(this);
  DeviceGuard device(info.device);
  queued.clear();  // never issued: nothing to wait for
  if (comm) {
    // Finalize flushes the issued ops and waits for the group to quiesce, bounded by the timeout. An op still
    // running here was never waited on (unwinding after another error): abort rather than wait for peers.
    auto running = std::find_if(in_flight.begin(), in_flight.end(),
                                [](const auto& rec) { return cudaEventQuery(rec->done) != cudaSuccess; });
    ncclResult_t r = ncclInvalidUsage;
    if (running == in_flight.end()) {
      const auto deadline = Clock::now() + info.timeout;
      r = ncclCommFinalize(comm);
      Backoff backoff;
      while (r == ncclInProgress && Clock::now() < deadline) {
        backoff.pause();
        ncclResult_t q = ncclCommGetAsyncError(comm, &r);
        if (q != ncclSuccess) r = q;
      }
      if (r == ncclSuccess) r = ncclCommDestroy(comm);
      if (r != ncclSuccess)
        spdlog::warn("{}: closing the NCCL communicator on {}: ncclCommFinalize/ncclCommDestroy: {}; aborting it",
                     info.name, info.here(), ncclGetErrorString(r));
    } else {
      spdlog::warn("{}: destroying the NCCL communicator on {} while {} is still running: aborting it", info.name,
                   info.here(), (*running)->op);
    }
    if (r != ncclSuccess) {
      ncclResult_t a = ncclCommAbort(comm);
      if (a != ncclSuccess) spdlog::warn("{}: ncclCommAbort on {}: {}", info.name, info.here(), ncclGetErrorString(a));
    }
    comm = nullptr;
  }
  in_flight.clear();  // the communicator is gone, so no op touches these tensors any more
  if (scratch) cudaFree(scratch);
  if (inputs_ready) cudaEventDestroy(inputs_ready);
  if (stream) cudaStreamDestroy(stream);
}

ncclUniqueId fetch_unique_id(Store& store, const std::string& key, const GroupInfo& g) {
  Bytes bytes;
  try {
    bytes = store.get(key, g.timeout);
  } catch (const StoreError& e) {
    throw CommError(fmt::format("{}: rendezvous timed out after {} on {}: {} never published the NCCL id ('{}'): {}",
                                g.name, seconds_str(g.timeout), g.who(g.rank), g.who(0), key, e.what()));
  }
  ncclUniqueId id;
  if (bytes.size() != sizeof(id))
    throw CommError(fmt::format("{}: rendezvous on {}: the NCCL id under '{}' has {} bytes, expected {}", g.name,
                                g.who(g.rank), key, bytes.size(), sizeof(id)));
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

void create_group_resources(NcclGroup& g, const char* op) {
  g.check_cuda(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", op);
  g.check_cuda(cudaEventCreateWithFlags(&g.inputs_ready, cudaEventDisableTiming), "cudaEventCreateWithFlags", op);
  g.check_cuda(cudaMalloc(reinterpret_cast<void**>(&g.scratch), sizeof(float)), "cudaMalloc", op);
  g.check_cuda(cudaMemset(g.scratch, 0, sizeof(float)), "cudaMemset", op);
}

}  // namespace mt::nccl_detail

namespace mt {

using namespace nccl_detail;  // NOLINT(google-build-using-namespace): the group state

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store> store, const NcclOptions& opt) {
  GroupInfo info;
  info.name = opt.name.empty() ? fmt::format("nccl[{}]", fmt::join(opt.members, ",")) : opt.name;
  info.members = opt.members;
  info.device = opt.device;
  info.timeout = opt.timeout;
  const std::string& name = info.name;

  info.rank = rank_in_group(name, opt.members, opt.global_rank, opt.timeout, store.get());
  if (opt.device < 0) throw CommError(fmt::format("{}: CUDA device {} is negative", name, opt.device));
  const int rank = info.rank;
  const int size = static_cast<int>(opt.members.size());

  const int64_t instance = group_instance(*store, "nccl", name, opt.global_rank);
  const std::string id_key = fmt::format("nccl/{}/{}/id", name, instance);

  auto group = std::make_shared<NcclGroup>(std::move(info));
  NcclGroup& g = *group;
  ncclUniqueId id{};
  if (rank != 0) id = fetch_unique_id(*store, id_key, g.info);  // before touching the device

  std::lock_guard lock(g.mu);  // the group's helpers expect it held
  const char* op = "init";
  DeviceGuard device(g.info.device);
  g.check_cuda(device.status(), fmt::format("cudaSetDevice({})", g.info.device), op);
  create_group_resources(g, op);
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw g.fail(op, "failed", fmt::format("ncclGetUniqueId: {}", ncclGetErrorString(r)));
    try {
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      store->set(id_key, Bytes(p, p + sizeof(id)));
    } catch (const StoreError& e) {
      throw g.fail(op, "failed", fmt::format("publishing the NCCL id under '{}': {}", id_key, e.what()));
    }
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and ops return at once, so a missing peer is a timeout, not a hang
  config.commName = g.info.name.c_str();
  ncclResult_t r = ncclCommInitRankConfig(&g.comm, size, id, rank, &config);
  g.check_nccl(r, "ncclCommInitRankConfig", op, Clock::now() + g.info.timeout);
  return communicator_of(std::move(group));  // registers with the watchdog
}

std::unique_ptr<Communicator> split_nccl_communicator(Communicator& parent, const NcclOptions& opt) {
  NcclGroup& pg = group_of(parent, "split");
  const char* op = "split";
  std::lock_guard parent_lock(pg.mu);
  pg.throw_if_broken(op);
  DeviceGuard device(pg.info.device);
  pg.check_cuda(device.status(), fmt::format("cudaSetDevice({})", pg.info.device), op);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const auto deadline = Clock::now() + pg.info.timeout;

  // A non-blocking split may return before it is done: the parent (and the child, when there is one) report
  // ncclInProgress until then, and the next split or op must not use the parent before. Poll both.
  if (opt.members.empty()) {  // this rank joins no group of this split: it still takes part in the call
    ncclComm_t none = nullptr;
    ncclResult_t r = ncclCommSplit(pg.comm, NCCL_SPLIT_NOCOLOR, pg.info.rank, &none, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      throw pg.fail(op, "failed", fmt::format("ncclCommSplit (no color): {}", ncclGetErrorString(r)));
    pg.check_nccl(ncclInProgress, "ncclCommSplit (no color), parent", op, deadline);
    return nullptr;
  }
  GroupInfo info;
  info.name = opt.name.empty() ? fmt::format("nccl[{}]", fmt::join(opt.members, ",")) : opt.name;
  info.members = opt.members;
  info.device = pg.info.device;
  info.timeout = opt.timeout;
  // rank_in_group wants a store only to check that one exists; a split needs none.
  static std::shared_ptr<Store> no_store = make_hash_store();
  info.rank = rank_in_group(info.name, opt.members, opt.global_rank, opt.timeout, no_store.get());
  auto group = std::make_shared<NcclGroup>(std::move(info));
  NcclGroup& g = *group;
  std::lock_guard lock(g.mu);
  create_group_resources(g, op);
  config.commName = g.info.name.c_str();
  // Color: the group's first global rank (unique per group of one split); key: the rank within the group.
  ncclResult_t r = ncclCommSplit(pg.comm, g.info.members.front(), g.info.rank, &g.comm, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    throw g.fail(op, "failed", fmt::format("ncclCommSplit of {}: {}", pg.info.name, ncclGetErrorString(r)));
  // A non-blocking split hands out the child's handle from NCCL's own thread when its job ends: with NCCL 2.28 on
  // an H100 it was still null when ncclCommSplit returned ncclInProgress. Wait for the parent, then for the handle.
  pg.check_nccl(ncclInProgress, "ncclCommSplit, parent", op, deadline);
  Backoff backoff;
  while (!std::atomic_ref<ncclComm_t>(g.comm).load(std::memory_order_acquire)) {
    if (Clock::now() >= deadline)
      throw g.fail(op, "timed out after " + seconds_str(g.info.timeout),
                   fmt::format("ncclCommSplit of {} gave no communicator (has every member joined?)", pg.info.name));
    backoff.pause();
  }
  g.check_nccl(ncclInProgress, "ncclCommSplit, child", op, deadline);
  return communicator_of(std::move(group));
}

std::string nccl_version() {
  auto text = [](int code) {  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch
    return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  };
  int loaded = 0;
  const std::string built = text(NCCL_VERSION_CODE);
  if (ncclGetVersion(&loaded) != ncclSuccess) return fmt::format("unknown (built with {})", built);
  return fmt::format("{} (built with {})", text(loaded), built);
}

}  // namespace mt
