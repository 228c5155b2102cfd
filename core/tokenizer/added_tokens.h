// added_tokens.h: cutting Hugging Face's added and special tokens out of the raw text before pre-tokenization,
// as its AddedVocabulary does: two passes (tokens with normalized=false, then normalized=true, matched on the
// normalized text when the tokenizer has a normalizer), leftmost-longest matches, single_word / lstrip / rstrip.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tokenizer/pretokenizer.h"

namespace mt {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool normalized = false;   // matched in the second pass
  bool single_word = false;  // only where neither neighbour is a word character (Rust regex's \w)
  bool lstrip = false;       // also swallows the whitespace before it
  bool rstrip = false;       // also swallows the whitespace after it
};

// A piece of text: ordinary text to pre-tokenize, or one added token.
struct Segment {
  std::string_view text;
  int32_t added_id = -1;  // -1: ordinary text
};

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);  // keeps pointers into `tokens`
  bool empty() const { return raw_.empty && normalized_.empty; }
  // Replaces `segments` (initially the whole text as one ordinary segment) with the cut pieces: the tokens with
  // normalized=false (cut_raw, on the raw text), then those with normalized=true (cut_normalized, on the
  // normalizer's output of each ordinary piece).
  void cut_raw(std::vector<Segment>& segments, std::vector<Segment>& tmp, SplitScratch& scratch) const {
    cut_pass(raw_, segments, tmp, scratch);
  }
  void cut_normalized(std::vector<Segment>& segments, std::vector<Segment>& tmp, SplitScratch& scratch) const {
    cut_pass(normalized_, segments, tmp, scratch);
  }

 private:
  struct Pass {
    std::vector<const AddedToken*> by_first_byte[256];  // longest first
    bool empty = true;
  };
  void cut_pass(const Pass& pass, std::vector<Segment>& segments, std::vector<Segment>& tmp,
                SplitScratch& scratch) const;
  void cut_one(const Pass& pass, std::string_view s, std::vector<Segment>& out, SplitScratch& scratch) const;

  Pass raw_, normalized_;
  std::unique_ptr<CharTest> word_, space_;
};

}  // namespace mt
