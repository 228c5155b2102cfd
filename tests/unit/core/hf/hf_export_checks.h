// hf_export_checks.h: reading back what the Hugging Face export writes: just enough JSON for a safetensors
// header, the safetensors file itself, and a tiny GPT checkpoint (TinyGpt) with check_export, which compares an
// export with it tensor by tensor.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/base/dtype.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/checkpoint/checkpoint_fixture.h"
#include "tests/unit/file_text.h"

namespace mt::ckpt_test {

// Just enough JSON for a safetensors header.
struct Json {
  enum Kind { null, number, string, array, object } kind = null;
  double num = 0;
  std::string str;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;
  const Json& operator[](const std::string& k) const {
    for (const auto& [name, v] : fields)
      if (name == k) return v;
    throw std::out_of_range("no key " + k);
  }
  std::vector<int64_t> ints() const {
    std::vector<int64_t> out;
    for (const auto& i : items) out.push_back(static_cast<int64_t>(i.num));
    return out;
  }
};

struct JsonParser {
  const std::string& s;
  size_t i = 0;
  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  void expect(char c) {
    ws();
    if (s.at(i) != c) throw std::runtime_error(std::string("json: expected ") + c + " at " + std::to_string(i));
    ++i;
  }
  std::string str() {
    expect('"');
    std::string out;
    while (s.at(i) != '"') {
      if (s[i] == '\\') {
        ++i;
        char c = s.at(i);
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        out += s[i];
      }
      ++i;
    }
    ++i;
    return out;
  }
  Json value() {
    ws();
    Json j;
    char c = s.at(i);
    if (c == '{') {
      j.kind = Json::object;
      ++i;
      ws();
      if (s.at(i) == '}') return ++i, j;
      for (;;) {
        std::string k = str();
        expect(':');
        j.fields.emplace_back(k, value());
        ws();
        if (s.at(i++) == '}') return j;
      }
    }
    if (c == '[') {
      j.kind = Json::array;
      ++i;
      ws();
      if (s.at(i) == ']') return ++i, j;
      for (;;) {
        j.items.push_back(value());
        ws();
        if (s.at(i++) == ']') return j;
      }
    }
    for (const char* lit : {"true", "false", "null"}) {
      if (s.compare(i, std::strlen(lit), lit) == 0) {
        i += std::strlen(lit);
        j.kind = lit[0] == 'n' ? Json::null : Json::number;
        j.num = lit[0] == 't';
        return j;
      }
    }
    if (c == '"') {
      j.kind = Json::string;
      j.str = str();
      return j;
    }
    size_t used = 0;
    j.kind = Json::number;
    j.num = std::stod(s.substr(i), &used);
    i += used;
    return j;
  }
};

struct SafetensorsFile {
  Json header;
  std::string header_text;
  std::string data;  // the bytes after the header
  uint64_t header_len = 0;
  std::vector<float> floats(const std::string& name) const {
    const Json& t = header[name];
    auto off = t["data_offsets"].ints();
    const std::string& dt = t["dtype"].str;
    std::vector<float> out;
    for (int64_t p = off[0]; p < off[1];) {
      if (dt == "F32") {
        float f;
        std::memcpy(&f, data.data() + p, 4);
        out.push_back(f);
        p += 4;
      } else {
        uint16_t h;
        std::memcpy(&h, data.data() + p, 2);
        out.push_back(dt == "BF16" ? bf16_to_float(h) : f16_to_float(h));
        p += 2;
      }
    }
    return out;
  }
  Shape shape(const std::string& name) const { return header[name]["shape"].ints(); }
};

inline SafetensorsFile read_safetensors(const std::string& path) {
  std::string bytes = slurp(path);
  SafetensorsFile f;
  EXPECT_GE(bytes.size(), 8u);
  for (int k = 0; k < 8; ++k) f.header_len |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[k])) << (8 * k);
  EXPECT_EQ((8 + f.header_len) % 8, 0u) << "data must start 8-byte aligned";
  f.header_text = bytes.substr(8, f.header_len);
  JsonParser p{f.header_text};
  f.header = p.value();
  p.ws();
  EXPECT_EQ(p.i, f.header_text.size()) << "only space padding may follow the header JSON";
  f.data = bytes.substr(8 + f.header_len);
  // Offsets tile the data exactly, as the safetensors loader demands.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [name, t] : f.header.fields)
    if (name != "__metadata__") ranges.emplace_back(t["data_offsets"].ints()[0], t["data_offsets"].ints()[1]);
  std::sort(ranges.begin(), ranges.end());
  int64_t end = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, end);
    end = e;
  }
  EXPECT_EQ(end, static_cast<int64_t>(f.data.size()));
  return f;
}

struct TinyGpt {
  static constexpr int64_t L = 2, C = 8, H = 2, D = 4, F = 32, V = 11, Vpad = 16, P = 6;
  bool tied = true;
  std::map<std::string, std::pair<Shape, std::vector<float>>> params;  // "model.<name>" -> values

  explicit TinyGpt(bool tied_) : tied(tied_) {
    float base = 0;
    auto add = [&](const std::string& name, Shape s) {
      base += 1000.f;  // every element distinct across the model, exact in fp32
      params["model." + name] = {s, iota(shape_numel(s), base, 1.f)};
    };
    add("embedding.word_embeddings.weight", {Vpad, C});
    add("embedding.position_embeddings.weight", {P, C});
    for (int i = 0; i < L; ++i) {
      std::string p = "layers." + std::to_string(i) + ".";
      add(p + "ln1.weight", {C});
      add(p + "ln1.bias", {C});
      add(p + "attn.qkv.weight", {3 * C, C});
      add(p + "attn.qkv.bias", {3 * C});
      add(p + "attn.proj.weight", {C, C});
      add(p + "attn.proj.bias", {C});
      add(p + "ln2.weight", {C});
      add(p + "ln2.bias", {C});
      add(p + "mlp.fc1.weight", {F, C});
      add(p + "mlp.fc1.bias", {F});
      add(p + "mlp.fc2.weight", {C, F});
      add(p + "mlp.fc2.bias", {C});
    }
    add("final_ln.weight", {C});
    add("final_ln.bias", {C});
    if (!tied) add("lm_head.weight", {Vpad, C});
  }

  std::string config() const {
    return std::string(
               "model:\n  arch: gpt\n  num_layers: 2\n  hidden_size: 8\n  num_heads: 2\n  ffn_hidden_size: 0\n"
               "  seq_length: 6\n  max_position_embeddings: 0\n  vocab_size: 11\n  tie_embeddings: ") +
           (tied ? "true" : "false") +
           "\n  dropout: 0.1\n  attention_dropout: 0.05\n  layernorm_eps: 1.0e-05\n  init_std: 0.02\n"
           "training:\n  seed: 1\n";
  }

  // Saves the model (qkv weights as two row blocks, as two TP ranks would) plus an optimizer state.
  std::string save(const std::string& save_dir) const {
    std::vector<TensorSlice> ts;
    for (const auto& [name, p] : params) {
      const auto& [shape, v] = p;
      if (name.find("qkv.weight") != std::string::npos) {
        ts.push_back({name, shape, {0, 0}, Tensor::from_floats(block(v, C, 0, 12, 0, C), {12, C})});
        ts.push_back({name, shape, {12, 0}, Tensor::from_floats(block(v, C, 12, 12, 0, C), {12, C})});
      } else {
        ts.push_back({name, shape, {}, Tensor::from_floats(v, shape)});
      }
    }
    ts.push_back({"optimizer.exp_avg.final_ln.weight", {C}, {}, make({C}, DType::f32, 0.f)});
    CheckpointState st;
    st.iteration = 42;
    st.config_yaml = config();
    return save_checkpoint(save_dir, st, ts, 0);
  }
  const std::vector<float>& v(const std::string& name) const { return params.at("model." + name).second; }
};

inline void check_export(const TinyGpt& m, const SafetensorsFile& f, DType dtype) {
  using T = TinyGpt;
  auto r = [&](float x) { return round_to(dtype, x); };
  auto wte = f.floats("transformer.wte.weight");
  EXPECT_EQ(f.shape("transformer.wte.weight"), (Shape{T::V, T::C}));  // padding rows dropped
  for (int64_t i = 0; i < T::V * T::C; ++i) ASSERT_EQ(wte[i], r(m.v("embedding.word_embeddings.weight")[i]));
  EXPECT_EQ(f.shape("transformer.wpe.weight"), (Shape{T::P, T::C}));
  for (int l = 0; l < T::L; ++l) {
    std::string ours = "layers." + std::to_string(l) + ".", hf = "transformer.h." + std::to_string(l) + ".";
    auto ln = f.floats(hf + "ln_1.weight");
    for (int64_t i = 0; i < T::C; ++i) ASSERT_EQ(ln[i], r(m.v(ours + "ln1.weight")[i]));
    ASSERT_EQ(f.shape(hf + "attn.c_attn.weight"), (Shape{T::C, 3 * T::C}));
    auto qkv = m.v(ours + "attn.qkv.weight"), cat = f.floats(hf + "attn.c_attn.weight");
    auto qkvb = m.v(ours + "attn.qkv.bias"), catb = f.floats(hf + "attn.c_attn.bias");
    for (int64_t h = 0; h < T::H; ++h)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t d = 0; d < T::D; ++d) {
          int64_t row = (h * 3 + j) * T::D + d, col = j * T::C + h * T::D + d;
          ASSERT_EQ(catb[col], r(qkvb[row])) << "bias h=" << h << " j=" << j << " d=" << d;
          for (int64_t c = 0; c < T::C; ++c) ASSERT_EQ(cat[c * 3 * T::C + col], r(qkv[row * T::C + c]));
        }
    auto transposed = [&](const std::string& theirs, const std::string& mine, int64_t out, int64_t in) {
      ASSERT_EQ(f.shape(theirs), (Shape{in, out})) << theirs;
      auto t = f.floats(theirs);
      auto w = m.v(mine);
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) ASSERT_EQ(t[i * out + o], r(w[o * in + i])) << theirs;
    };
    transposed(hf + "attn.c_proj.weight", ours + "attn.proj.weight", T::C, T::C);
    transposed(hf + "mlp.c_fc.weight", ours + "mlp.fc1.weight", T::F, T::C);
    transposed(hf + "mlp.c_proj.weight", ours + "mlp.fc2.weight", T::C, T::F);
    auto b = f.floats(hf + "mlp.c_fc.bias");
    for (int64_t i = 0; i < T::F; ++i) ASSERT_EQ(b[i], r(m.v(ours + "mlp.fc1.bias")[i]));
  }
  EXPECT_EQ(f.floats("transformer.ln_f.bias").size(), static_cast<size_t>(T::C));
  size_t expected = 2 + 12 * T::L + 2 + (m.tied ? 0 : 1) + 1;  // + __metadata__
  EXPECT_EQ(f.header.fields.size(), expected);
  if (!m.tied) {
    EXPECT_EQ(f.shape("lm_head.weight"), (Shape{T::V, T::C}));
    EXPECT_EQ(f.floats("lm_head.weight")[T::V * T::C - 1], r(m.v("lm_head.weight")[T::V * T::C - 1]));
  } else {
    EXPECT_THROW(f.header["lm_head.weight"], std::out_of_range);
  }
}

}  // namespace mt::ckpt_test
