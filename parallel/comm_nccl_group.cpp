// comm_nccl_group.cpp: an NCCL group's setup and teardown: the NCCL id's rendezvous, the stream, event and
// scratch every group owns, and the closing of the communicator.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "parallel/comm_nccl_detail.h"

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
