// thread_ranks.h: threads of one process as ranks, for the parallel runtime's tests and `megatrain bench kernels`:
// run_ranks runs one function per rank on its own thread, join_gloo gives each its Gloo communicator of a group
// (one shared in-process store, make_hash_store()).
#pragma once
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/communicator.h"

namespace mt {

// Runs fn(rank) on n threads, one per rank, and rethrows the first exception any of them threw.
inline void run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// The communicator of group `name` with `members` (global ranks, ascending) for global rank `rank`.
inline std::unique_ptr<Communicator> join_gloo(std::shared_ptr<Store> store, const std::string& name,
                                               std::vector<int> members, int rank,
                                               std::chrono::milliseconds timeout = std::chrono::seconds(20),
                                               bool shared_memory = true) {
  GlooOptions opt;
  opt.shared_memory = shared_memory;
  opt.name = name;
  opt.members = std::move(members);
  opt.global_rank = rank;
  opt.timeout = timeout;
  return make_gloo_communicator(std::move(store), opt);
}

inline std::vector<int> first_ranks(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

}  // namespace mt
