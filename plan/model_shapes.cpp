// model_shapes.cpp: the per-arch table (see model_shapes.h).
#include "plan/model_shapes.h"

namespace mt::plan {

ModelShapes model_shapes(const ModelConfig& m, int64_t tp) {
  const bool llama = m.arch == Arch::llama;
  // The config rules make tp divide the heads, the key/value heads and the ffn width, and the vocabulary padded.
  const double D = static_cast<double>(m.head_dim);
  const double Ht = static_cast<double>(m.num_heads / tp), Gt = static_cast<double>(m.kv_heads() / tp);
  const double Ft = static_cast<double>(m.ffn_hidden_size / tp);
  return ModelShapes{.C = static_cast<double>(m.hidden_size),
                     .D = D,
                     .Ht = Ht,
                     .Gt = Gt,
                     .Ct = Ht * D,
                     .qkv = (Ht + 2 * Gt) * D,
                     .Ft = Ft,
                     .fc1 = llama ? 2 * Ft : Ft,
                     .Vt = static_cast<double>(m.padded_vocab_size / tp),
                     .P = llama ? 0 : static_cast<double>(m.max_position_embeddings),
                     .linear_bias = !llama,
                     .layernorm = !llama,
                     .gelu_epilogue = !llama,
                     .rotary = llama,
                     .tie_embeddings = m.tie_embeddings};
}

std::vector<double> ModelShapes::layer_parameters() const {
  std::vector<double> n;
  auto norm = [&] {
    n.push_back(C);                 // weight
    if (layernorm) n.push_back(C);  // bias
  };
  auto linear = [&](double out, double in) {
    n.push_back(out * in);              // weight (out, in)
    if (linear_bias) n.push_back(out);  // bias (out); a row-parallel bias is whole on every rank
  };
  norm();          // ln1
  linear(qkv, C);  // attn.qkv
  linear(C, Ct);   // attn.proj
  norm();          // ln2
  linear(fc1, C);  // mlp.fc1
  linear(C, Ft);   // mlp.fc2
  return n;
}

double ModelShapes::layer_parameter_count() const {
  double n = 0;
  for (double e : layer_parameters()) n += e;
  return n;
}

}  // namespace mt::plan
