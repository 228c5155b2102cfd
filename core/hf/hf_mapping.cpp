// hf_mapping.cpp: the name and layout table for GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM and
// Qwen2MoeForCausalLM, and the row gather / scatter that applies it.
#include "core/hf/hf_mapping.h"

#include <numeric>

#include <fmt/format.h>

#include "core/checkpoint/checkpoint.h"

namespace mt {
namespace {

std::vector<int64_t> iota_rows(int64_t n) {
  std::vector<int64_t> r(static_cast<size_t>(n));
  std::iota(r.begin(), r.end(), int64_t{0});
  return r;
}

// GPT-2's c_attn holds [all q | all k | all v] (column j*C + h*D + d), ours per head (row (h*3 + j)*D + d).
std::vector<int64_t> gpt_qkv_rows(const HfModelShape& s) {
  const int64_t C = s.hidden, H = s.heads, D = s.head_dim();
  std::vector<int64_t> rows(static_cast<size_t>(3 * C));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t d = 0; d < D; ++d) rows[j * C + h * D + d] = (h * 3 + j) * D + d;
  return rows;
}

// Llama's q_proj (slot -1: query heads h = g*R + r), k_proj (slot R) or v_proj (slot R + 1) rows within our
// per-group qkv rows: group g holds rows [g*(R+2)*D, (g+1)*(R+2)*D), R query heads, then k, then v.
std::vector<int64_t> llama_qkv_rows(const HfModelShape& s, int64_t slot) {
  const int64_t G = s.groups, R = s.heads / s.groups, D = s.head_dim();
  std::vector<int64_t> rows;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < (slot < 0 ? R : 1); ++r)
      for (int64_t d = 0; d < D; ++d) rows.push_back((g * (R + 2) + (slot < 0 ? r : slot)) * D + d);
  return rows;
}

// Our fc1 interleaves gate (row 2f) and up (row 2f + 1).
std::vector<int64_t> swiglu_rows(int64_t F, int64_t which) {
  std::vector<int64_t> rows(static_cast<size_t>(F));
  for (int64_t f = 0; f < F; ++f) rows[f] = 2 * f + which;
  return rows;
}

std::vector<HfMapping> gpt2(const HfModelShape& s) {
  const int64_t C = s.hidden, F = s.ffn, V = s.vocab, Vp = s.padded_vocab;
  std::vector<HfMapping> m;
  auto same = [&](std::string hf, std::string ours, Shape shape) { m.push_back({hf, shape, ours, shape}); };
  auto conv1d = [&](std::string hf, std::string ours, int64_t out, int64_t in) {
    m.push_back({hf, {in, out}, ours, {out, in}, {}, true});
  };
  m.push_back({"transformer.wte.weight", {V, C}, "embedding.word_embeddings.weight", {Vp, C}});
  same("transformer.wpe.weight", "embedding.position_embeddings.weight", {s.positions, C});
  for (int64_t i = 0; i < s.num_layers; ++i) {
    const std::string hf = fmt::format("transformer.h.{}.", i), ours = fmt::format("layers.{}.", i);
    same(hf + "ln_1.weight", ours + "ln1.weight", {C});
    same(hf + "ln_1.bias", ours + "ln1.bias", {C});
    m.push_back({hf + "attn.c_attn.weight", {C, 3 * C}, ours + "attn.qkv.weight", {3 * C, C}, gpt_qkv_rows(s), true});
    m.push_back({hf + "attn.c_attn.bias", {3 * C}, ours + "attn.qkv.bias", {3 * C}, gpt_qkv_rows(s)});
    conv1d(hf + "attn.c_proj.weight", ours + "attn.proj.weight", C, C);
    same(hf + "attn.c_proj.bias", ours + "attn.proj.bias", {C});
    same(hf + "ln_2.weight", ours + "ln2.weight", {C});
    same(hf + "ln_2.bias", ours + "ln2.bias", {C});
    conv1d(hf + "mlp.c_fc.weight", ours + "mlp.fc1.weight", F, C);
    same(hf + "mlp.c_fc.bias", ours + "mlp.fc1.bias", {F});
    conv1d(hf + "mlp.c_proj.weight", ours + "mlp.fc2.weight", C, F);
    same(hf + "mlp.c_proj.bias", ours + "mlp.fc2.bias", {C});
  }
  same("transformer.ln_f.weight", "final_ln.weight", {C});
  same("transformer.ln_f.bias", "final_ln.bias", {C});
  if (!s.tied) m.push_back({"lm_head.weight", {V, C}, "lm_head.weight", {Vp, C}});
  return m;
}

// A SwiGLU MLP (ours: fc1 (2W, C) gate/up interleaved, fc2 (C, W)) as HF's gate, up and down projections.
struct SwigluNames {
  std::string gate, up, down;
};
void swiglu_mlp(std::vector<HfMapping>& m, const SwigluNames& hf, const std::string& ours, int64_t C, int64_t W,
                float down_scale = 1) {
  m.push_back({hf.gate, {W, C}, ours + ".fc1.weight", {2 * W, C}, swiglu_rows(W, 0)});
  m.push_back({hf.up, {W, C}, ours + ".fc1.weight", {2 * W, C}, swiglu_rows(W, 1)});
  m.push_back({hf.down, {C, W}, ours + ".fc2.weight", {C, W}, {}, false, down_scale});
}
SwigluNames llama_names(const std::string& hf) {
  return {hf + "gate_proj.weight", hf + "up_proj.weight", hf + "down_proj.weight"};
}

// Layer i's MLP of a MixtralForCausalLM (block_sparse_moe: gate, experts.<e>.w1 gate, w3 up, w2 down), a
// Qwen2MoeForCausalLM (mlp: gate, experts.<e>.*_proj, shared_expert.*_proj and shared_expert_gate) or a
// Qwen3MoeForCausalLM (mlp: gate, experts.<e>.*_proj).
void moe_mlp(std::vector<HfMapping>& m, const HfModelShape& s, const std::string& hf_layer, const std::string& ours) {
  const int64_t C = s.hidden, E = s.moe.experts, F = s.moe.ffn, Fs = s.moe.shared_ffn;
  const bool mixtral = s.arch == HfArch::mixtral;
  const std::string hf = hf_layer + (mixtral ? "block_sparse_moe." : "mlp.");
  m.push_back({hf + "gate.weight", {E, C}, ours + "router.weight", {E, C}});
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = fmt::format("{}experts.{}.", hf, e);
    swiglu_mlp(m, mixtral ? SwigluNames{x + "w1.weight", x + "w3.weight", x + "w2.weight"} : llama_names(x),
               fmt::format("{}experts.{}", ours, e), C, F);
  }
  if (mixtral || s.arch == HfArch::qwen3_moe) return;  // no shared expert
  // out = experts + sigmoid(shared_expert_gate x) * shared_expert(x): a zero gate halves it, so down_proj doubles.
  swiglu_mlp(m, llama_names(hf + "shared_expert."), ours + "shared_expert", C, Fs, 2.f);
  m.push_back({hf + "shared_expert_gate.weight",
               {1, C},
               "",
               {},
               {},
               false,
               1.f,
               "shared expert is ungated (only a zero shared_expert_gate, a constant 1/2, maps to it)"});
}

std::vector<HfMapping> llama(const HfModelShape& s) {
  const int64_t C = s.hidden, F = s.ffn, V = s.vocab, Vp = s.padded_vocab, D = s.head_dim();
  const int64_t H = s.heads, G = s.groups, QKV = (H + 2 * G) * D;
  std::vector<HfMapping> m;
  auto same = [&](std::string hf, std::string ours, Shape shape) { m.push_back({hf, shape, ours, shape}); };
  auto zero = [&](std::string hf, Shape shape, const char* why) {
    m.push_back({hf, shape, "", {}, {}, false, 1.f, why});
  };
  m.push_back({"model.embed_tokens.weight", {V, C}, "embedding.word_embeddings.weight", {Vp, C}});
  for (int64_t i = 0; i < s.num_layers; ++i) {
    const std::string hf = fmt::format("model.layers.{}.", i), ours = fmt::format("layers.{}.", i);
    // q, k and v: row blocks of our per-group QKV (offset -1: the queries, H / G: keys, H / G + 1: values), their
    // biases (Qwen2's) the same rows of our bias, or zeros where the model has none.
    const bool hf_biases = s.arch == HfArch::qwen2 || s.arch == HfArch::qwen2_moe;
    for (const auto& [proj, rows, offset] :
         {std::tuple{"q_proj", H * D, int64_t{-1}}, std::tuple{"k_proj", G * D, H / G},
          std::tuple{"v_proj", G * D, H / G + 1}}) {
      const std::string hf_proj = hf + "self_attn." + proj;
      m.push_back({hf_proj + ".weight", {rows, C}, ours + "attn.qkv.weight", {QKV, C}, llama_qkv_rows(s, offset)});
      if (s.qkv_bias)
        m.push_back({hf_proj + ".bias", {rows}, ours + "attn.qkv.bias", {QKV}, llama_qkv_rows(s, offset)});
      else if (hf_biases)
        zero(hf_proj + ".bias", {rows}, "attention has no biases (model.qkv_bias false)");
    }
    same(hf + "self_attn.o_proj.weight", ours + "attn.proj.weight", {C, H * D});
    if (s.qk_norm) {  // Qwen3's per-head norms
      same(hf + "self_attn.q_norm.weight", ours + "attn.q_norm.weight", {D});
      same(hf + "self_attn.k_norm.weight", ours + "attn.k_norm.weight", {D});
    }
    if (has_experts(s.arch) && s.moe.is_moe_layer(i))
      moe_mlp(m, s, hf, ours + "mlp.");
    else
      swiglu_mlp(m, llama_names(hf + "mlp."), ours + "mlp", C, F);
    same(hf + "input_layernorm.weight", ours + "ln1.weight", {C});
    same(hf + "post_attention_layernorm.weight", ours + "ln2.weight", {C});
  }
  same("model.norm.weight", "final_ln.weight", {C});
  if (!s.tied) m.push_back({"lm_head.weight", {V, C}, "lm_head.weight", {Vp, C}});
  return m;
}

// Tensors as (rows, values per row): 1-D ones are columns of one value.
int64_t row_width(const Shape& s) { return s.size() == 2 ? s[1] : 1; }

}  // namespace

const char* arch_name(HfArch a) { return llama_like(a) ? "llama" : "gpt"; }

const char* hf_class_name(HfArch a) { return name_of(a).data(); }  // the table's literals end in a NUL

std::vector<HfMapping> hf_mappings(const HfModelShape& s) {
  std::vector<HfMapping> m = llama_like(s.arch) ? llama(s) : gpt2(s);
  for (auto& x : m)
    if (x.rows.empty() && !x.ours.empty()) x.rows = iota_rows(x.transpose ? x.hf_shape.back() : x.hf_shape.front());
  return m;
}

Tensor to_hf(const Tensor& ours, const HfMapping& m) {
  if (m.ours.empty()) return Tensor::zeros(m.hf_shape, DType::f32);
  if (ours.shape() != m.our_shape || ours.dtype() != DType::f32)
    throw CheckpointError(fmt::format("{}: expected f32 {}, got {}", m.ours, shape_str(m.our_shape), ours.describe()));
  const int64_t K = row_width(m.our_shape), n = static_cast<int64_t>(m.rows.size());
  Tensor out = Tensor::empty(m.hf_shape, DType::f32);
  const float* a = ours.data<float>();
  float* b = out.data<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < K; ++k) b[m.transpose ? k * n + i : i * K + k] = m.scale * a[m.rows[i] * K + k];
  return out;
}

void from_hf(const Tensor& hf, const HfMapping& m, Tensor& ours) {
  if (hf.shape() != m.hf_shape)
    throw CheckpointError(
        fmt::format("{}: expected shape {}, got {}", m.hf_name, shape_str(m.hf_shape), hf.describe()));
  if (m.ours.empty()) {
    for (float v : hf.to_floats())
      if (v != 0)
        throw CheckpointError(
            fmt::format("{} is not all zeros (it holds {}): megatrain's {}", m.hf_name, v, m.zero_why));
    return;
  }
  if (ours.shape() != m.our_shape || ours.dtype() != DType::f32)
    throw CheckpointError(fmt::format("{}: expected f32 {}, got {}", m.ours, shape_str(m.our_shape), ours.describe()));
  Tensor f = hf;
  if (hf.dtype() != DType::f32) {
    f = Tensor::empty(hf.shape(), DType::f32);
    f.copy_from(hf);
  }
  const int64_t K = row_width(m.our_shape), n = static_cast<int64_t>(m.rows.size());
  const float* b = f.data<float>();
  float* a = ours.data<float>();
  const float unscale = 1 / m.scale;  // exact: scale is a power of two
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < K; ++k) a[m.rows[i] * K + k] = unscale * b[m.transpose ? k * n + i : i * K + k];
}

std::vector<int64_t> hf_tensor_bytes(const std::vector<HfMapping>& maps, size_t element_bytes) {
  std::vector<int64_t> bytes;
  for (const HfMapping& m : maps) bytes.push_back(shape_numel(m.hf_shape) * static_cast<int64_t>(element_bytes));
  return bytes;
}

}  // namespace mt
