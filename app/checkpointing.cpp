#include "app/checkpointing.h"

#include <fmt/format.h>

namespace mt::app {

namespace {

TensorSlice slice_of(const std::string& name, const Parameter& p, const Tensor& data) {
  return TensorSlice{.name = name, .global_shape = p.global_shape, .start = p.start, .data = data};
}

void read_checked(const CheckpointReader& reader, const std::string& name, const Parameter& p, Tensor& out) {
  if (!reader.has(name))
    throw CheckpointError(fmt::format("{}: checkpoint has no tensor '{}' (a different model?)", reader.dir(), name));
  const TensorInfo& info = reader.info(name);
  if (info.global_shape != p.global_shape)
    throw CheckpointError(fmt::format("{}: tensor '{}' has shape {} in the checkpoint but {} in this model",
                                      reader.dir(), name, shape_str(info.global_shape), shape_str(p.global_shape)));
  reader.read(name, out, p.start);
}

}  // namespace

std::vector<TensorSlice> optimizer_tensors(AdamW& opt) {
  std::vector<TensorSlice> out;
  for (auto& s : opt.slots()) {
    const Parameter& p = *s.param;
    out.push_back(slice_of("model." + p.name, p, s.master));
    out.push_back(slice_of("optimizer.exp_avg." + p.name, p, s.exp_avg));
    out.push_back(slice_of("optimizer.exp_avg_sq." + p.name, p, s.exp_avg_sq));
  }
  return out;
}

void load_parameters(const CheckpointReader& reader, const std::vector<Parameter*>& params) {
  for (Parameter* p : params) read_checked(reader, "model." + p->name, *p, p->value);
}

void load_optimizer(const CheckpointReader& reader, AdamW& opt) {
  for (auto& s : opt.slots()) {
    const Parameter& p = *s.param;
    read_checked(reader, "model." + p.name, p, s.master);
    read_checked(reader, "optimizer.exp_avg." + p.name, p, s.exp_avg);
    read_checked(reader, "optimizer.exp_avg_sq." + p.name, p, s.exp_avg_sq);
  }
  opt.sync_values_from_master();
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
