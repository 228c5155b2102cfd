// pretokenizer.cpp: PCRE2-backed splitting for the BPE tokenizers.
#include "core/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include "core/io/file_error.h"  // DataError

namespace mt {

const char* const kGpt2SplitPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Hugging Face's tokenizers match with Oniguruma, whose Unicode \s is exactly the White_Space property.
// PCRE2's \s (UCP) also matches U+180E (MONGOLIAN VOWEL SEPARATOR, a format character since Unicode 6.3), so
// "!\u180e" would split differently. Spelling \s / \S out as White_Space keeps the two engines in agreement;
// this rewrites escapes only, the matching stays PCRE2's.
const char* const kWhiteSpaceClass =
    "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
const char* const kRustWordClass = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}";

namespace {

std::string oniguruma_whitespace(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceClass) : fmt::format("[{}]", kWhiteSpaceClass);
      } else if (e == 'S') {
        if (in_class)  // [^\S]-style double negation: used by no known tokenizer
          throw DataError(
              fmt::format("pre-tokenizer pattern '{}': \\S inside a character class is not supported", pattern));
        out += fmt::format("[^{}]", kWhiteSpaceClass);
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == '[' && in_class && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // [:alpha:] inside a class
      const size_t end = pattern.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(pattern, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

RegexSplit::RegexSplit(const std::string& pattern, bool literal, const std::string& where, bool anchored) {
  const std::string source = literal ? pattern : oniguruma_whitespace(pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
      PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0) | (anchored ? PCRE2_ANCHORED : 0), &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw DataError(fmt::format("{}: cannot compile the pre-tokenizer pattern '{}': {} at offset {}", where, pattern,
                                reinterpret_cast<const char*>(msg), offset));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;  // without a JIT the interpreter matches
}

RegexSplit::~RegexSplit() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

SplitScratch::SplitScratch() {
  // The default 32 KiB JIT stack can be too small for very long pieces; 64 MiB is only reserved, not used.
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  mctx_ = pcre2_match_context_create(nullptr);
  if (jit_stack_ && mctx_)
    pcre2_jit_stack_assign(static_cast<pcre2_match_context*>(mctx_), nullptr,
                           static_cast<pcre2_jit_stack*>(jit_stack_));
}

SplitScratch::~SplitScratch() {
  for (auto& [re, md] : data_) pcre2_match_data_free(static_cast<pcre2_match_data*>(md));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(mctx_));
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

void* SplitScratch::match_data(const RegexSplit& re) {
  for (auto& [r, md] : data_)
    if (r == &re) return md;
  void* md = pcre2_match_data_create_from_pattern(static_cast<const pcre2_code*>(re.code()), nullptr);
  if (!md) throw std::bad_alloc();
  data_.emplace_back(&re, md);
  return md;
}

namespace {

// Appends the Isolated split of `text` by `re` to out.
void split_one(const RegexSplit& re, std::string_view text, std::vector<std::string_view>& out, SplitScratch& scratch) {
  auto* code = static_cast<const pcre2_code*>(re.code());
  auto* md = static_cast<pcre2_match_data*>(scratch.match_data(re));
  auto* mctx = static_cast<pcre2_match_context*>(scratch.match_context());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, last = 0;  // pos: where the next search starts; last: the end of the last piece
  while (pos <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw DataError(fmt::format("pre-tokenizer: matching failed: {}", reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // an empty match splits nothing; step over one character
      pos = start + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > last) out.push_back(text.substr(last, start - last));
    out.push_back(text.substr(start, end - start));
    last = pos = end;
  }
  if (last < text.size()) out.push_back(text.substr(last));
}

}  // namespace

bool CharTest::at(std::string_view text, size_t pos, SplitScratch& scratch) const {
  if (pos >= text.size()) return false;
  auto* md = static_cast<pcre2_match_data*>(scratch.match_data(re_));
  const int rc =
      pcre2_match(static_cast<const pcre2_code*>(re_.code()), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                  pos, PCRE2_NO_UTF_CHECK, md, static_cast<pcre2_match_context*>(scratch.match_context()));
  return rc > 0;
}

void Metaspace::apply(std::string_view text, bool at_start, std::string& out,
                      std::vector<std::string_view>& pieces) const {
  out.clear();
  pieces.clear();
  if (text.empty()) return;
  const bool starts = text[0] == ' ' || text.substr(0, replacement.size()) == replacement;
  if (!starts && (prepend == Prepend::always || (prepend == Prepend::first && at_start))) out += replacement;
  for (char c : text) {
    if (c == ' ')
      out += replacement;
    else
      out += c;
  }
  if (!split) {
    pieces.push_back(out);
    return;
  }
  // MergedWithNext: each replacement begins a piece.
  size_t begin = 0;
  for (size_t at = out.find(replacement, 1); at != std::string::npos; at = out.find(replacement, at + 1)) {
    pieces.push_back(std::string_view(out).substr(begin, at - begin));
    begin = at;
  }
  pieces.push_back(std::string_view(out).substr(begin));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces,
                         std::vector<std::string_view>& tmp, SplitScratch& scratch) const {
  pieces.clear();
  if (text.empty()) return;
  pieces.push_back(text);
  for (const auto& step : steps_) {
    tmp.clear();
    for (std::string_view p : pieces) split_one(*step, p, tmp, scratch);
    pieces.swap(tmp);
  }
}

}  // namespace mt
