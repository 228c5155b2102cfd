// normalizer.h: tokenizer.json's normalizer, run on each piece of text between added tokens before
// pre-tokenization (Hugging Face's order: added tokens with normalized=false are cut out of the raw text first,
// the rest is normalized, and those with normalized=true, whose content went through the same normalizer, are
// matched on the normalized text). Steps: Prepend, Replace (String or Regex pattern), NFC / NFD / NFKC / NFKD,
// Lowercase and Strip (normalizer_unicode.cpp, with ICU), and a Sequence of them.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/tokenizer/pretokenizer.h"

namespace mt {

class NormalizerStep {
 public:
  virtual ~NormalizerStep() = default;
  // out = this step applied to in (valid UTF-8 in and out). `scratch`: this thread's regex match buffers.
  virtual void apply(std::string_view in, std::string& out, SplitScratch& scratch) const = 0;
};

class Normalizer {
 public:
  bool empty() const { return steps_.empty(); }
  void add_step(std::unique_ptr<NormalizerStep> step) { steps_.push_back(std::move(step)); }
  // The normalized text: `in` itself when there are no steps, else a view of a or b (scratch buffers).
  std::string_view apply(std::string_view in, std::string& a, std::string& b, SplitScratch& scratch) const;
  std::string apply(std::string_view in) const;  // for one-off texts (added tokens' content)

 private:
  std::vector<std::unique_ptr<NormalizerStep>> steps_;
};

// `j` is the normalizer member (null: none). Throws DataError naming `where` and the normalizer for one that is
// not implemented (Precompiled, BertNormalizer, StripAccents, Nmt, ByteLevel, ...).
Normalizer load_normalizer(const nlohmann::json& j, const std::string& where);

// The ICU-backed steps (normalizer_unicode.cpp). `form`: "NFC", "NFD", "NFKC" or "NFKD".
std::unique_ptr<NormalizerStep> make_unicode_form(const std::string& form);
std::unique_ptr<NormalizerStep> make_lowercase();
std::unique_ptr<NormalizerStep> make_strip(bool left, bool right);

}  // namespace mt
