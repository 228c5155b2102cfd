// embedding.cpp: token and position embeddings on the CPU, with vocabulary shards (vocab_start) and
// sequence shards (position_offset). The backward scatters rows in token order, so it is deterministic.
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

namespace {

// The shard row of token id, or -1 when the id lies outside [vocab_start, vocab_start + V).
int64_t shard_row(int32_t id, int64_t vocab_start, int64_t V, const char* op) {
  if (id < 0) throw std::invalid_argument(std::string(op) + ": negative token id " + std::to_string(id));
  const int64_t r = static_cast<int64_t>(id) - vocab_start;
  return r >= 0 && r < V ? r : -1;
}

// Packed documents: the position of token t of sample b of this call (sequence shard): positions[b,
// position_offset + t], which must lie in [0, rows).
int64_t document_position(const EmbeddingOptions& opt, int64_t rows, int64_t b, int64_t t) {
  const int64_t col = opt.position_offset + t, p = opt.positions.data<int32_t>()[b * opt.positions.dim(1) + col];
  if (p < 0 || p >= rows)
    throw std::invalid_argument("position embedding: positions[" + std::to_string(b) + ", " + std::to_string(col) +
                                "] = " + std::to_string(p) + " lies outside the table's " + std::to_string(rows) +
                                " rows");
  return p;
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, const EmbeddingOptions& opt) {
  const int64_t BT = ids.numel(), V = table.dim(0), C = table.dim(1);
  const int32_t* id = ids.data<int32_t>();  // (B*T)
  std::vector<float> row(C);                // (C)
  for (int64_t i = 0; i < BT; ++i) {
    const int64_t r = shard_row(id[i], opt.vocab_start, V, "embedding_forward");
    if (r >= 0) {
      load_f32(table, r * C, C, row.data());
    } else {
      for (int64_t c = 0; c < C; ++c) row[c] = 0.f;
    }
    store_f32(row.data(), C, out, i * C);
  }
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, const EmbeddingOptions& opt) {
  const int64_t BT = ids.numel(), V = dtable.dim(0), C = dtable.dim(1);
  const int32_t* id = ids.data<int32_t>();  // (B*T)
  float* dt = dtable.data<float>();         // (V, C)
  std::vector<float> row(C);                // (C)
  for (int64_t i = 0; i < BT; ++i) {
    const int64_t r = shard_row(id[i], opt.vocab_start, V, "embedding_backward");
    if (r < 0) continue;
    load_f32(dout, i * C, C, row.data());
    float* dst = dt + r * C;
    for (int64_t c = 0; c < C; ++c) dst[c] += row[c];
  }
}

void position_embedding_add(Tensor& x, const Tensor& wpe, const EmbeddingOptions& opt) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  std::vector<float> pos(C), row(C);  // (C) each
  if (opt.positions.defined()) {      // packed documents: token (b, t) at row positions[b, position_offset + t]
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        load_f32(wpe, document_position(opt, wpe.dim(0), b, t) * C, C, pos.data());
        const int64_t at = (b * T + t) * C;
        load_f32(x, at, C, row.data());
        for (int64_t c = 0; c < C; ++c) row[c] += pos[c];
        store_f32(row.data(), C, x, at);
      }
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    load_f32(wpe, position_at(opt, t) * C, C, pos.data());
    for (int64_t b = 0; b < B; ++b) {
      const int64_t at = (b * T + t) * C;
      load_f32(x, at, C, row.data());
      for (int64_t c = 0; c < C; ++c) row[c] += pos[c];
      store_f32(row.data(), C, x, at);
    }
  }
}

void position_embedding_backward(const Tensor& dout, Tensor& dwpe, const EmbeddingOptions& opt) {
  const int64_t B = dout.dim(0), T = dout.dim(1), C = dout.dim(2);
  float* dw = dwpe.data<float>();  // (P, C)
  std::vector<double> acc(C);      // (C)
  std::vector<float> row(C);       // (C)
  if (opt.positions.defined()) {   // packed documents: each token's row added to its own position's, in token order
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        load_f32(dout, (b * T + t) * C, C, row.data());
        float* dst = dw + document_position(opt, dwpe.dim(0), b, t) * C;
        for (int64_t c = 0; c < C; ++c) dst[c] += row[c];
      }
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) acc[c] = 0.0;
    for (int64_t b = 0; b < B; ++b) {
      load_f32(dout, (b * T + t) * C, C, row.data());
      for (int64_t c = 0; c < C; ++c) acc[c] += row[c];
    }
    float* dst = dw + position_at(opt, t) * C;
    for (int64_t c = 0; c < C; ++c) dst[c] += static_cast<float>(acc[c]);
  }
}

}  // namespace mt::cpu
