// normalizer.h: tokenizer.json's normalizer, run on each piece of text between added tokens before
// pre-tokenization (Hugging Face's order: added tokens with normalized=false are cut out of the raw text first,
// those with normalized=true are matched on the normalized text). Prepend and Replace (with a String pattern)
// as a Sequence: what Llama-2 / Mistral style SentencePiece BPE files use ("▁" before the text, spaces as "▁").
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

class NormalizerStep {
 public:
  virtual ~NormalizerStep() = default;
  // out = this step applied to in (valid UTF-8 in and out).
  virtual void apply(std::string_view in, std::string& out) const = 0;
};

class Normalizer {
 public:
  bool empty() const { return steps_.empty(); }
  void add_step(std::unique_ptr<NormalizerStep> step) { steps_.push_back(std::move(step)); }
  // The normalized text: `in` itself when there are no steps, else a view of a or b (scratch buffers).
  std::string_view apply(std::string_view in, std::string& a, std::string& b) const;

 private:
  std::vector<std::unique_ptr<NormalizerStep>> steps_;
};

// `j` is the normalizer member (null: none). Throws DataError naming `where` and the normalizer for one that is
// not implemented.
Normalizer load_normalizer(const nlohmann::json& j, const std::string& where);

}  // namespace mt
