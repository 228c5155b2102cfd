// moe_exchange.cpp: a MoE layer's expert-parallel exchange (models/moe_mlp.h): the counts and order of the
// all-to-all, and the rows there and back.
#include <algorithm>
#include <numeric>
#include <vector>

#include "models/moe_mlp.h"

namespace mt {

// Expert parallelism: this rank's choices (R, C), ordered by global expert, go to the EP ranks holding the experts;
// the rows received (from every EP rank, for this rank's experts) are reordered expert-major (expert l's rows from
// rank 0, then rank 1, ...), so each local expert's rows are one slice. plan_exchange (forward) exchanges every
// rank's per-expert counts and fills the routing fields of `s`; to_experts and from_experts (forward and backward)
// move rows by them.
void MoeMlp::plan_exchange(Saved& s) const {
  const int64_t E = cfg_.moe.num_experts, El = ep_.count(E), P = ep_.size;
  std::vector<double> mine(static_cast<size_t>(P * E), 0.0);  // exact: counts far below 2^53
  for (int64_t e = 0; e < E; ++e)
    mine[static_cast<size_t>(ep_.rank * E + e)] = static_cast<double>(s.sent[static_cast<size_t>(e)]);
  const std::vector<double> all = sum_doubles(*ep_.comm, std::move(mine));
  auto count = [&](int64_t r, int64_t e) { return std::llround(all[static_cast<size_t>(r * E + e)]); };
  s.send_rows.assign(static_cast<size_t>(P), 0);
  s.recv_rows.assign(static_cast<size_t>(P), 0);
  s.expert_rows.assign(static_cast<size_t>(El), 0);
  for (int64_t r = 0; r < P; ++r)
    for (int64_t l = 0; l < El; ++l) {
      s.send_rows[static_cast<size_t>(r)] += s.sent[static_cast<size_t>(r * El + l)];
      s.recv_rows[static_cast<size_t>(r)] += count(r, first_expert_ + l);
      s.expert_rows[static_cast<size_t>(l)] += count(r, first_expert_ + l);
    }
  // Received row i (from rank r, expert l, the j-th) -> its expert-major row.
  std::vector<int64_t> start(static_cast<size_t>(El), 0);  // expert l's first row, then its next free one per rank
  for (int64_t l = 1; l < El; ++l)
    start[static_cast<size_t>(l)] = start[static_cast<size_t>(l - 1)] + s.expert_rows[static_cast<size_t>(l - 1)];
  std::vector<int32_t> order;
  for (int64_t r = 0; r < P; ++r)
    for (int64_t l = 0; l < El; ++l)
      for (int64_t j = 0, n = count(r, first_expert_ + l); j < n; ++j)
        order.push_back(static_cast<int32_t>(start[static_cast<size_t>(l)]++));
  const auto Rr = static_cast<int64_t>(order.size());
  s.order = Tensor::from_ints(order, {Rr, 1}).to(device_);
  const double balanced =
      std::accumulate(all.begin(), all.end(), 0.0) * static_cast<double>(El) / static_cast<double>(E);
  if (balanced > 0) peak_received_ = std::max(peak_received_, static_cast<double>(Rr) / balanced);  // the EP group's
}

Tensor MoeMlp::to_experts(const Tensor& rows, const Saved& s) const {
  const int64_t Rr = s.order.dim(0), C = rows.dim(1);
  Tensor received = Tensor::empty({Rr, C}, rows.dtype(), device_);
  all_to_all_rows(rows, s.send_rows, received, s.recv_rows);
  Tensor out = Tensor::empty({Rr, C}, rows.dtype(), device_);
  moe_permute(received, s.order, nullptr, out);
  return out;
}

// The inverse: the expert-major rows (this rank's experts' outputs or input gradients) back, in the order each
// EP rank sent them, to the ranks whose tokens they are.
Tensor MoeMlp::from_experts(const Tensor& rows, const Saved& s) const {
  const int64_t C = rows.dim(1);
  Tensor by_rank = Tensor::empty(rows.shape(), rows.dtype(), device_);
  moe_unpermute(rows, s.order, nullptr, by_rank);
  int64_t R = 0;
  for (int64_t n : s.send_rows) R += n;
  Tensor out = Tensor::empty({R, C}, rows.dtype(), device_);
  all_to_all_rows(by_rank, s.recv_rows, out, s.send_rows);
  return out;
}

void MoeMlp::all_to_all_rows(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                             const std::vector<int64_t>& recv_rows) const {
  const int64_t C = in.dim(1);
  std::vector<int64_t> send(send_rows.size()), recv(recv_rows.size());
  for (size_t r = 0; r < send.size(); ++r) send[r] = send_rows[r] * C;
  for (size_t r = 0; r < recv.size(); ++r) recv[r] = recv_rows[r] * C;
  ep_.comm->all_to_all(in, send, out, recv)->wait();
}

}  // namespace mt
