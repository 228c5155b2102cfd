#include "app/checkpointing.h"

#include <algorithm>

#include <fmt/format.h>

namespace mt::app {

namespace {

// Checkpoint files are written from host memory: device tensors are copied over first.
TensorSlice slice_of(const std::string& name, const Parameter& p, const Tensor& data) {
  return TensorSlice{.name = name, .global_shape = p.global_shape, .start = p.start,
                     .data = data.device() == Device::cpu ? data : data.to(Device::cpu, MemKind::workspace)};
}

// Vocabulary tables are padded to a multiple of 128 * tensor-parallel size, so their row count depends on
// the layout. Padding rows are never looked up and are left out of the softmax: only the rows both layouts
// hold are read; rows beyond the checkpoint's keep their initial values.
bool is_vocabulary_table(const std::string& param_name) {
  return param_name == "embedding.word_embeddings.weight" || param_name == "lm_head.weight";
}

void read_checked(const CheckpointReader& reader, const std::string& name, const Parameter& p, Tensor& out) {
  if (out.device() != Device::cpu) {  // read on the host (starting from out's values), then copy over
    Tensor host = out.to(Device::cpu, MemKind::workspace);
    read_checked(reader, name, p, host);
    return out.copy_from(host);
  }
  if (!reader.has(name))
    throw CheckpointError(fmt::format("{}: checkpoint has no tensor '{}' (a different model?)", reader.dir(), name));
  const TensorInfo& info = reader.info(name);
  const bool padded_rows_differ = is_vocabulary_table(p.name) && info.global_shape.size() == 2 &&
                                  info.global_shape[1] == p.global_shape[1];
  if (info.global_shape != p.global_shape && !padded_rows_differ)
    throw CheckpointError(fmt::format("{}: tensor '{}' has shape {} in the checkpoint but {} in this model",
                                      reader.dir(), name, shape_str(info.global_shape), shape_str(p.global_shape)));
  if (info.global_shape == p.global_shape) return reader.read(name, out, p.start);
  const int64_t rows = std::clamp<int64_t>(info.global_shape[0] - p.start[0], 0, out.dim(0));
  if (rows == 0) return;
  Tensor part = out.slice(0, rows);
  reader.read(name, part, p.start);
}

}  // namespace

std::vector<TensorSlice> optimizer_tensors(const std::vector<AdamW::Slot>& slots,
                                          const std::function<bool(const Parameter&)>& keep) {
  std::vector<TensorSlice> out;
  for (const auto& s : slots) {
    const Parameter& p = *s.param;
    if (keep && !keep(p)) continue;
    out.push_back(slice_of("model." + p.name, p, s.master));
    out.push_back(slice_of("optimizer.exp_avg." + p.name, p, s.exp_avg));
    out.push_back(slice_of("optimizer.exp_avg_sq." + p.name, p, s.exp_avg_sq));
  }
  return out;
}

void load_parameters(const CheckpointReader& reader, const std::vector<Parameter*>& params) {
  for (Parameter* p : params) read_checked(reader, "model." + p->name, *p, p->value);
}

void load_optimizer(const CheckpointReader& reader, const std::vector<AdamW::Slot>& slots) {
  for (auto s : slots) {
    const Parameter& p = *s.param;
    read_checked(reader, "model." + p.name, p, s.master);
    read_checked(reader, "optimizer.exp_avg." + p.name, p, s.exp_avg);
    read_checked(reader, "optimizer.exp_avg_sq." + p.name, p, s.exp_avg_sq);
  }
}

namespace {
const std::string& state_value(const CheckpointState& s, const std::string& key, const std::string& dir) {
  auto it = s.values.find(key);
  if (it == s.values.end()) throw CheckpointError(fmt::format("{}: metadata lacks state value '{}'", dir, key));
  return it->second;
}
}  // namespace

int64_t state_int(const CheckpointState& s, const std::string& key, const std::string& dir) {
  const std::string& v = state_value(s, key, dir);
  try {
    size_t used = 0;
    int64_t x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw CheckpointError(fmt::format("{}: state value '{}' = '{}' is not an integer", dir, key, v));
}

double state_double(const CheckpointState& s, const std::string& key, const std::string& dir) {
  const std::string& v = state_value(s, key, dir);
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw CheckpointError(fmt::format("{}: state value '{}' = '{}' is not a number", dir, key, v));
}

}  // namespace mt::app
