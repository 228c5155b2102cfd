// normalizer.cpp: tokenizer.json normalizers (see normalizer.h).
#include "core/tokenizer/normalizer.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/io/file_error.h"  // DataError

namespace mt {

using nlohmann::json;

namespace {

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "?";
}

// Prepend: the string before a non-empty text.
class Prepend final : public NormalizerStep {
 public:
  explicit Prepend(std::string s) : s_(std::move(s)) {}
  void apply(std::string_view in, std::string& out, SplitScratch&) const override {
    out.clear();
    if (in.empty()) return;
    out.reserve(s_.size() + in.size());
    out.append(s_).append(in);
  }

 private:
  std::string s_;
};

// Replace with a String pattern: every non-overlapping occurrence, left to right.
class ReplaceString final : public NormalizerStep {
 public:
  ReplaceString(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void apply(std::string_view in, std::string& out, SplitScratch&) const override {
    out.clear();
    out.reserve(in.size());
    size_t at = 0;
    for (size_t hit; (hit = in.find(pattern_, at)) != std::string_view::npos; at = hit + pattern_.size())
      out.append(in.substr(at, hit - at)).append(content_);
    out.append(in.substr(at));
  }

 private:
  std::string pattern_, content_;
};

// Replace with a Regex pattern (tokenizers matches it with Oniguruma; PCRE2 here, with \\s spelt as White_Space as
// the pre-tokenizer does). Matches are found as Oniguruma's find_iter finds them: each search starts where the
// last match ended, and an empty match right at the end of the previous match is skipped by one character
// (so "x*" on "abxxc" replaces at 0, 1, 2..4 and 5, not again at 4). The content is literal ("$1" stays "$1").
class ReplaceRegex final : public NormalizerStep {
 public:
  ReplaceRegex(const std::string& pattern, std::string content, const std::string& where)
      : re_(pattern, false, where + ": normalizer Replace"), content_(std::move(content)) {}
  void apply(std::string_view in, std::string& out, SplitScratch& scratch) const override {
    out.clear();
    out.reserve(in.size());
    auto* code = static_cast<const pcre2_code*>(re_.code());
    auto* md = static_cast<pcre2_match_data*>(scratch.match_data(re_));
    auto* mctx = static_cast<pcre2_match_context*>(scratch.match_context());
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(in.data());
    size_t search = 0, copied = 0;  // where the next search starts; the end of what is in `out`
    bool matched = false;           // whether a match ended at `copied`
    while (!in.empty() && search <= in.size()) {
      const int rc = pcre2_match(code, subject, in.size(), search, PCRE2_NO_UTF_CHECK, md, mctx);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw DataError(fmt::format("normalizer Replace: matching failed: {}", reinterpret_cast<const char*>(msg)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t start = ov[0], end = ov[1];
      if (start == end && matched && end == copied) {  // empty, right after the last match: step one character
        ++search;
        while (search < in.size() && (static_cast<unsigned char>(in[search]) & 0xC0) == 0x80) ++search;
        continue;
      }
      out.append(in.substr(copied, start - copied)).append(content_);
      copied = search = end;
      matched = true;
    }
    out.append(in.substr(copied));
  }

 private:
  RegexSplit re_;
  std::string content_;
};

bool flag(const json& j, const char* key, bool otherwise) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : otherwise;
}

void add_steps(const json& j, const std::string& where, Normalizer& n) {
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const json& s : j.value("normalizers", json::array())) add_steps(s, where, n);
    return;
  }
  if (t == "Prepend") {
    if (!j.contains("prepend") || !j["prepend"].is_string())
      throw DataError(fmt::format("{}: normalizer Prepend has no 'prepend' string", where));
    n.add_step(std::make_unique<Prepend>(j["prepend"].get<std::string>()));
    return;
  }
  if (t == "Replace") {
    const json& p = j.value("pattern", json());
    if (!j.contains("content") || !j["content"].is_string())
      throw DataError(fmt::format("{}: normalizer Replace has no 'content' string", where));
    if (p.is_object() && p.contains("String") && p["String"].is_string() && !p["String"].get<std::string>().empty()) {
      n.add_step(std::make_unique<ReplaceString>(p["String"].get<std::string>(), j["content"].get<std::string>()));
      return;
    }
    if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) {
      n.add_step(std::make_unique<ReplaceRegex>(p["Regex"].get<std::string>(), j["content"].get<std::string>(), where));
      return;
    }
    throw DataError(
        fmt::format("{}: normalizer Replace with pattern {} is not supported (only a non-empty String or a Regex)",
                    where, p.dump()));
  }
  if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
    n.add_step(make_unicode_form(t));
    return;
  }
  if (t == "Lowercase") {
    n.add_step(make_lowercase());
    return;
  }
  if (t == "Strip") {
    n.add_step(make_strip(flag(j, "strip_left", true), flag(j, "strip_right", true)));
    return;
  }
  throw DataError(fmt::format(
      "{}: normalizer '{}' is not supported (Prepend, Replace, NFC, NFD, NFKC, NFKD, Lowercase, Strip, or a "
      "Sequence of them)",
      where, t));
}

}  // namespace

std::string_view Normalizer::apply(std::string_view in, std::string& a, std::string& b, SplitScratch& scratch) const {
  std::string_view cur = in;
  bool into_a = true;
  for (const auto& step : steps_) {
    std::string& out = into_a ? a : b;
    step->apply(cur, out, scratch);
    cur = out;
    into_a = !into_a;
  }
  return cur;
}

std::string Normalizer::apply(std::string_view in) const {
  std::string a, b;
  SplitScratch scratch;
  return std::string(apply(in, a, b, scratch));
}

Normalizer load_normalizer(const json& j, const std::string& where) {
  Normalizer n;
  if (!j.is_null()) add_steps(j, where, n);
  return n;
}

}  // namespace mt
