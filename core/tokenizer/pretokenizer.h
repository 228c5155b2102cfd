// pretokenizer.h: splitting text into the words BPE sees, with Unicode-aware regular expressions (PCRE2 in
// UTF + UCP mode, JIT-compiled when the library has a JIT). Matches and the text between them both become
// pieces, in order (Hugging Face's Split with behavior "Isolated"); empty pieces are dropped.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

// GPT-2's pre-tokenizer pattern, as Hugging Face's ByteLevel(use_regex=true) applies it.
extern const char* const kGpt2SplitPattern;

// One compiled pattern. Thread-safe: each thread matches with its own SplitScratch.
class RegexSplit {
 public:
  // `literal`: the pattern is plain text to split on, not a regex (HF's {"String": ...} pattern).
  // `where` names the pattern's origin in compile errors. `anchored`: matches only where the search starts.
  RegexSplit(const std::string& pattern, bool literal, const std::string& where, bool anchored = false);
  ~RegexSplit();
  RegexSplit(const RegexSplit&) = delete;
  RegexSplit& operator=(const RegexSplit&) = delete;

  void* code() const { return code_; }  // pcre2_code_8*
  bool jit() const { return jit_; }

 private:
  void* code_ = nullptr;
  bool jit_ = false;
};

// Match buffers for one thread and one PreTokenizer.
class SplitScratch {
 public:
  SplitScratch();
  ~SplitScratch();
  SplitScratch(const SplitScratch&) = delete;
  SplitScratch& operator=(const SplitScratch&) = delete;
  void* match_data(const RegexSplit& re);  // pcre2_match_data_8*, made on first use
  void* match_context() const { return mctx_; }

 private:
  std::vector<std::pair<const RegexSplit*, void*>> data_;
  void* jit_stack_ = nullptr;
  void* mctx_ = nullptr;
};

// Whether one character at a byte offset belongs to a character class; for the word and space tests of added
// tokens (single_word, lstrip, rstrip), which Hugging Face makes with Rust's regex crate.
class CharTest {
 public:
  explicit CharTest(const std::string& char_class) : re_(char_class, false, "character test", true) {}
  bool at(std::string_view text, size_t pos, SplitScratch& scratch) const;

 private:
  RegexSplit re_;
};

// Unicode's White_Space property as a class body (Oniguruma's and Rust regex's \s), and Rust regex's \w.
extern const char* const kWhiteSpaceClass;
extern const char* const kRustWordClass;

// Hugging Face's Metaspace pre-tokenizer (SentencePiece-style BPE): spaces become the replacement ("▁"), which is
// also put before the text (prepend_scheme "always"; "first": only before the text's first piece, i.e. not after
// an added token; "never"), unless it starts with one; with `split`, a piece starts at every replacement.
struct Metaspace {
  enum class Prepend { always, first, never };
  std::string replacement = "\xE2\x96\x81";  // U+2581
  Prepend prepend = Prepend::always;
  bool split = true;
  // `out` = the replaced text; `pieces` = views into out. `at_start`: text begins the original input.
  void apply(std::string_view text, bool at_start, std::string& out, std::vector<std::string_view>& pieces) const;
};

// A sequence of splits: every step splits every piece of the step before.
class PreTokenizer {
 public:
  void add_step(std::unique_ptr<RegexSplit> step) { steps_.push_back(std::move(step)); }
  size_t num_steps() const { return steps_.size(); }
  // Replaces `pieces` with the pieces of `text` (valid UTF-8; views into text).
  void split(std::string_view text, std::vector<std::string_view>& pieces, std::vector<std::string_view>& tmp,
             SplitScratch& scratch) const;

 private:
  std::vector<std::unique_ptr<RegexSplit>> steps_;
};

}  // namespace mt
