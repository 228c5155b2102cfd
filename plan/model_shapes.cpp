// model_shapes.cpp: the per-arch table (see model_shapes.h).
#include "plan/model_shapes.h"

#include <algorithm>

#include <fmt/format.h>

namespace mt::plan {

ModelShapes model_shapes(const ModelConfig& m, int64_t tp, int64_t ep, int64_t etp) {
  if (etp == 0) etp = tp;
  const bool llama = m.arch == Arch::llama;
  // The config rules make tp divide the heads, the key/value heads, the ffn width (the experts' and the shared
  // expert's too), and the vocabulary padded.
  const double D = static_cast<double>(m.head_dim);
  const double Ht = static_cast<double>(m.num_heads / tp), Gt = static_cast<double>(m.kv_heads() / tp);
  const double Ft = static_cast<double>(m.ffn_hidden_size / tp);
  ModelShapes s{.C = static_cast<double>(m.hidden_size),
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
                .qkv_bias = !llama || m.qkv_bias,
                .layernorm = !llama,
                .gelu_epilogue = !llama,
                .rotary = llama,
                .qk_norm = m.qk_norm,
                .attention_work = m.attention_work_fraction(),
                .tie_embeddings = m.tie_embeddings};
  const MoeConfig& e = m.moe;
  if (e.enabled()) {
    const double et = static_cast<double>(e.ffn_hidden_size / etp),
                 st = static_cast<double>(e.shared_expert_ffn_hidden_size / tp);
    s.moe = MoeShapes{.E = static_cast<double>(e.num_experts),
                      .El = static_cast<double>(e.num_experts / ep),
                      .ep = static_cast<double>(ep),
                      .folds = static_cast<double>(tp / etp),
                      .k = static_cast<double>(e.top_k),
                      .Ft = et,
                      .fc1 = llama ? 2 * et : et,
                      .Fst = st,
                      .sfc1 = llama ? 2 * st : st,
                      .keep_logits = e.aux_loss_coeff > 0 || e.z_loss_coeff > 0,
                      .imbalance = moe_imbalance(e, ep).factor};
    s.moe_layers.resize(static_cast<size_t>(m.num_layers));
    for (int64_t l = 0; l < m.num_layers; ++l) s.moe_layers[static_cast<size_t>(l)] = e.is_moe_layer(l);
  }
  return s;
}

MoeImbalance moe_imbalance(const MoeConfig& moe, int64_t ep, int64_t cp, int64_t folds) {
  if (!moe.enabled() || ep <= 1) return {1, "no expert parallelism"};
  const double k = static_cast<double>(moe.top_k), local = static_cast<double>(moe.num_experts / ep);
  const double worst = static_cast<double>(ep) * std::min(k, local) / k;
  // The capacity holds per microbatch, over its cp context ranks: an EP group of fewer of them (ep / folds) may get
  // all of a microbatch's kept rows, cp / (ep / folds) times its share.
  const double capacity =
      moe.capacity_factor * std::max(1.0, static_cast<double>(cp * folds) / static_cast<double>(ep));
  if (moe.plan_imbalance > 0 && (moe.capacity_factor <= 0 || moe.plan_imbalance < capacity))
    return {std::min(std::max(1.0, moe.plan_imbalance), worst),
            fmt::format("--moe-imbalance {:g} (a run's moe_peak_received)", moe.plan_imbalance)};
  if (moe.capacity_factor > 0)
    return {std::min(capacity, worst),
            capacity == moe.capacity_factor
                ? fmt::format("model.moe.capacity_factor {:g} (rows beyond it are dropped)", moe.capacity_factor)
                : fmt::format("model.moe.capacity_factor {:g} over {} context ranks, {} of them in an expert-parallel "
                              "group (rows beyond it are dropped)",
                              moe.capacity_factor, cp, ep / folds)};
  return {1, fmt::format("balanced routing, not a bound: dropless routing can reach {:.2f}x (every choice on one "
                         "rank's experts); pass --moe-imbalance with a run's moe_peak_received, or set "
                         "model.moe.capacity_factor",
                         worst)};
}

int64_t ModelShapes::moe_count(int64_t begin, int64_t n) const {
  int64_t count = 0;
  for (int64_t l = begin; l < begin + n; ++l) count += is_moe(l) ? 1 : 0;
  return count;
}

std::vector<double> ModelShapes::layer_parameters(int64_t layer, std::vector<double>* experts) const {
  std::vector<double> n;
  auto norm = [&] {
    n.push_back(C);                 // weight
    if (layernorm) n.push_back(C);  // bias
  };
  auto linear = [&](double out, double in, bool bias) {
    n.push_back(out * in);       // weight (out, in)
    if (bias) n.push_back(out);  // bias (out); a row-parallel bias is whole on every rank
  };
  norm();                      // ln1
  linear(qkv, C, qkv_bias);    // attn.qkv
  linear(C, Ct, linear_bias);  // attn.proj
  norm();                      // ln2
  if (!is_moe(layer)) {
    linear(fc1, C, linear_bias);  // mlp.fc1
    linear(C, Ft, linear_bias);   // mlp.fc2
    return n;
  }
  n.push_back(moe.E * C);  // mlp.router.weight (E, C)
  std::vector<double>& ex = experts ? *experts : n;
  for (double e = 0; e < moe.El; ++e) {
    ex.push_back(moe.fc1 * C);  // mlp.experts.<e>.fc1.weight (F1/ETP, C)
    ex.push_back(C * moe.Ft);   // mlp.experts.<e>.fc2.weight (C, F/ETP)
  }
  if (moe.shared()) {
    n.push_back(moe.sfc1 * C);  // mlp.shared_expert.fc1.weight
    n.push_back(C * moe.Fst);   // mlp.shared_expert.fc2.weight
  }
  return n;
}

double ModelShapes::layer_parameter_count(int64_t layer) const {
  double n = 0;
  for (double e : layer_parameters(layer)) n += e;  // this rank's experts included
  return n;
}

double ModelShapes::layer_gemm_weights(int64_t layer) const {
  const double attention = qkv * C + C * Ct;
  if (!is_moe(layer)) return attention + fc1 * C + C * Ft;
  return attention + moe.E * C + moe.k * (moe.fc1 + moe.Ft) * C + (moe.sfc1 + moe.Fst) * C;
}

double model_parameters(const ModelConfig& m, bool active) {
  const ModelShapes s = model_shapes(m, 1);
  double n = s.Vt * s.C * (s.tie_embeddings ? 1 : 2) + s.P * s.C + s.norm_parameters();
  for (int64_t l = 0; l < m.num_layers; ++l) {
    n += s.layer_parameter_count(l);
    if (active && s.is_moe(l)) n -= (s.moe.E - s.moe.k) * (s.moe.fc1 + s.moe.Ft) * s.C;  // the experts it skips
  }
  return n;
}

}  // namespace mt::plan
