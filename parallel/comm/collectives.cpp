// collectives.cpp: small blocking helpers over any communicator (sum_doubles, exchange_counts).
#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "parallel/comm/communicator.h"

namespace mt {

std::vector<double> sum_doubles(Communicator& comm, std::vector<double> values) {
  if (comm.size() == 1 || values.empty()) return values;
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::f64);
  std::copy(values.begin(), values.end(), t.data<double>());
  comm.all_reduce(t, ReduceOp::sum)->wait();
  std::copy(t.data<double>(), t.data<double>() + t.numel(), values.begin());
  return values;
}

std::vector<int64_t> exchange_counts(Communicator& comm, const std::vector<int64_t>& send_counts) {
  const int n = comm.size(), self = comm.rank();
  if (static_cast<int>(send_counts.size()) != n)
    throw std::invalid_argument(fmt::format("{}: exchange_counts on rank {}: {} send counts for a group of {}",
                                            comm.name(), self, send_counts.size(), n));
  if (n == 1) return send_counts;
  // all_gather moves bytes, so the counts travel as int64 bit for bit (f32 would round counts above 2^24).
  Tensor mine = Tensor::empty({n}, DType::i64);
  std::copy(send_counts.begin(), send_counts.end(), mine.data<int64_t>());
  Tensor all = Tensor::empty({int64_t{n} * n}, DType::i64);  // (n, n): row q is rank q's send counts
  comm.all_gather(mine, all)->wait();
  std::vector<int64_t> recv_counts(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) recv_counts[static_cast<size_t>(q)] = all.data<int64_t>()[int64_t{q} * n + self];
  return recv_counts;
}

}  // namespace mt
