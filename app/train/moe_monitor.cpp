// moe_monitor.cpp: the trainer's view of the mixture-of-experts layers (app/train/moe_monitor.h).
#include "app/train/moe_monitor.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace mt::app {

namespace {

// "layers.3.mlp" -> 3.
int64_t layer_of(const std::string& prefix) {
  const size_t dot = prefix.find('.'), next = prefix.find('.', dot + 1);
  return std::stoll(prefix.substr(dot + 1, next - dot - 1));
}

}  // namespace

MoeMonitor::MoeMonitor(const ModelConfig& cfg, const std::vector<std::unique_ptr<GptModel>>& chunks, Distributed& dist)
    : cfg_(cfg), dist_(dist) {
  std::vector<int64_t> moe_index(static_cast<size_t>(cfg.num_layers), -1);
  int64_t n = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    if (cfg.moe.is_moe_layer(l)) moe_index[static_cast<size_t>(l)] = n++;
  for (const auto& chunk : chunks)
    for (MoeMlp* m : chunk->moe_layers()) {
      layers_.push_back(m);
      global_index_.push_back(moe_index.at(static_cast<size_t>(layer_of(m->prefix()))));
    }
  interval_.resize(layers_.size());
  for (MoeLoad& l : interval_) l.tokens.assign(static_cast<size_t>(cfg.moe.num_experts), 0);
}

void MoeMonitor::after_step(bool applied) {
  const bool move_bias = cfg_.moe.bias_update_rate > 0 && applied;
  const size_t E = static_cast<size_t>(cfg_.moe.num_experts);
  std::vector<double> step_tokens;  // this rank's layers' counts, one block of E per layer
  for (size_t i = 0; i < layers_.size(); ++i) {
    const MoeLoad l = layers_[i]->take_load();
    MoeLoad& sum = interval_[i];
    for (size_t e = 0; e < E; ++e) sum.tokens[e] += l.tokens[e];
    sum.aux += l.aux;
    sum.z += l.z;
    sum.dropped += l.dropped;
    sum.microbatches += l.microbatches;
    if (move_bias) step_tokens.insert(step_tokens.end(), l.tokens.begin(), l.tokens.end());
  }
  if (!move_bias) return;
  // The whole step's tokens: every data-parallel (and context-parallel) rank's microbatches (the tensor-parallel
  // ranks of a replica each routed all of its tokens; each pipeline stage moves its own layers).
  if (dist_.dp_size() * dist_.cp_size() > 1) step_tokens = sum_doubles(dist_.weight_replicas(), std::move(step_tokens));
  for (size_t i = 0; i < layers_.size(); ++i) {
    std::vector<int64_t> tokens(E);
    for (size_t e = 0; e < E; ++e) tokens[e] = std::llround(step_tokens[i * E + e]);
    layers_[i]->update_expert_bias(tokens);
  }
}

MoeIntervalReport MoeMonitor::report(
    const std::function<std::vector<double>(std::vector<double>)>& sum_over_stages_and_replicas) {
  MoeIntervalReport r;
  if (!cfg_.moe.enabled()) return r;
  const size_t E = static_cast<size_t>(cfg_.moe.num_experts);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) moe_layers += cfg_.moe.is_moe_layer(l) ? 1 : 0;
  // One block per global MoE layer: E token counts, the aux and z sums, the microbatches, the dropped choices; zero
  // where another stage holds the layer. Counts stay exact in doubles (far below 2^53).
  const size_t block = E + 4;
  std::vector<double> v(static_cast<size_t>(moe_layers) * block, 0.0);
  for (size_t i = 0; i < layers_.size(); ++i) {
    double* b = v.data() + static_cast<size_t>(global_index_[i]) * block;
    const MoeLoad& l = interval_[i];
    for (size_t e = 0; e < E; ++e) b[e] = static_cast<double>(l.tokens[e]);
    b[E] = l.aux;
    b[E + 1] = l.z;
    b[E + 2] = static_cast<double>(l.microbatches);
    b[E + 3] = static_cast<double>(l.dropped);
    interval_[i] = MoeLoad{.tokens = std::vector<int64_t>(E, 0)};
  }
  v = sum_over_stages_and_replicas(std::move(v));
  r.enabled = true;
  r.has_aux = cfg_.moe.aux_loss_coeff > 0;
  r.has_z = cfg_.moe.z_loss_coeff > 0;
  double aux = 0, z = 0, microbatches = 0;
  int64_t global = 0;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    if (!cfg_.moe.is_moe_layer(l)) continue;
    const double* b = v.data() + static_cast<size_t>(global++) * block;
    MoeLayerLoad load{.layer = l};
    double sum = 0, sq = 0;
    load.min = load.max = static_cast<int64_t>(b[0]);
    for (size_t e = 0; e < E; ++e) {
      const auto t = static_cast<int64_t>(b[e]);
      load.min = std::min(load.min, t);
      load.max = std::max(load.max, t);
      sum += b[e];
      sq += b[e] * b[e];
    }
    const double mean = sum / static_cast<double>(E);
    load.mean = mean;
    load.cv = mean > 0 ? std::sqrt(std::max(0.0, sq / static_cast<double>(E) - mean * mean)) / mean : 0.0;
    r.layers.push_back(load);
    aux += b[E];
    z += b[E + 1];
    microbatches += b[E + 2];
    r.dropped_tokens += std::llround(b[E + 3]);
  }
  // Means over layers and microbatches.
  if (microbatches > 0) {
    r.aux_loss = aux / microbatches;
    r.z_loss = z / microbatches;
  }
  return r;
}

std::vector<std::pair<std::string, std::vector<float>>> MoeMonitor::expert_biases() const {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const MoeMlp* m : layers_)
    if (m->has_expert_bias()) out.emplace_back(m->prefix(), m->expert_bias());
  return out;
}

bool MoeMonitor::set_expert_bias(const std::string& prefix, const std::vector<float>& bias) {
  for (MoeMlp* m : layers_)
    if (m->prefix() == prefix) {
      m->set_expert_bias(bias);
      return true;
    }
  return false;
}

double MoeMonitor::peak_received() const {
  double peak = 0;
  for (const MoeMlp* layer : layers_) peak = std::max(peak, layer->peak_received());
  return peak;
}

}  // namespace mt::app
