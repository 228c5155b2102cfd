// normalizer_unicode.cpp: the normalizer steps that need Unicode data, done by ICU (Debian's libicu-dev) rather
// than by tables of our own: the four normalization forms, Lowercase and Strip, each as Hugging Face's
// tokenizers (Rust) computes it.
#include <fmt/format.h>
#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/uniset.h>
#include <unicode/utf8.h>

#include <climits>
#include <memory>

#include "core/io/file_error.h"  // DataError
#include "core/tokenizer/normalizer.h"

namespace mt {

namespace {

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

icu::StringPiece piece(std::string_view s, const char* what) {
  if (s.size() > static_cast<size_t>(INT32_MAX))
    throw DataError(fmt::format("normalizer {}: a text of {} bytes is over ICU's 2 GiB limit", what, s.size()));
  return icu::StringPiece(s.data(), static_cast<int32_t>(s.size()));
}

void check(UErrorCode status, const char* what) {
  if (U_FAILURE(status)) throw DataError(fmt::format("normalizer {}: ICU failed: {}", what, u_errorName(status)));
}

// NFC, NFD, NFKC, NFKD. tokenizers normalizes with the unicode-normalization-alignments crate, whose tables are
// Unicode 9.0's: it leaves alone what later versions gave a decomposition (U+32FF REIWA under NFKC) or a combining
// class (U+1DF6 is not reordered), while ICU 72 knows Unicode 15. ICU's FilteredNormalizer2 restricted to the
// characters assigned by 9.0 normalizes exactly as the crate does (every code point compared, one by one, for
// all four forms). ASCII is unchanged by all four.
constexpr const char* kNormalizationUnicodeAge = "[:age=9.0:]";

class UnicodeForm final : public NormalizerStep {
 public:
  UnicodeForm(const icu::Normalizer2& base, const icu::UnicodeSet& filter, std::string name)
      : n_(std::make_unique<icu::FilteredNormalizer2>(base, filter)), name_(std::move(name)) {}
  void apply(std::string_view in, std::string& out, SplitScratch&) const override {
    out.clear();
    if (is_ascii(in)) {
      out.assign(in);
      return;
    }
    icu::StringByteSink<std::string> sink(&out);
    UErrorCode status = U_ZERO_ERROR;
    n_->normalizeUTF8(0, piece(in, name_.c_str()), sink, nullptr, status);
    check(status, name_.c_str());
  }

 private:
  std::unique_ptr<icu::FilteredNormalizer2> n_;  // const use is thread-safe
  std::string name_;
};

// Lowercase: tokenizers maps every character on its own with Rust's char::to_lowercase, i.e. Unicode's full
// (SpecialCasing) mapping without conditions: "İ" -> "i̇", and "Σ" -> "σ" everywhere (no final sigma, which
// str::to_lowercase would apply). ICU's root-locale lowercasing is the same full mapping, and its only
// context-dependent rule in the root locale is Final_Sigma, so the text is lowercased between capital sigmas and
// each capital sigma becomes "σ". Known gap: tokenizers 0.23's Rust knows Unicode 17, ICU 72 Unicode 15, so the
// 55 capitals added since (U+1C89, U+A7CB..U+A7DC, Garay U+10D50..U+10D65, Beria Erfe U+16EA0..; unassigned to
// ICU 72) stay capitals here; every other code point lowercases as tokenizers does (compared one by one).
class Lowercase final : public NormalizerStep {
 public:
  void apply(std::string_view in, std::string& out, SplitScratch&) const override {
    out.clear();
    out.reserve(in.size());
    if (is_ascii(in)) {
      for (char c : in) out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
      return;
    }
    static constexpr std::string_view kCapitalSigma = "\xCE\xA3", kSmallSigma = "\xCF\x83";  // U+03A3, U+03C3
    icu::StringByteSink<std::string> sink(&out);
    for (size_t at = 0;;) {
      const size_t sigma = in.find(kCapitalSigma, at);
      const std::string_view run = in.substr(at, sigma == std::string_view::npos ? std::string_view::npos : sigma - at);
      if (!run.empty()) {
        UErrorCode status = U_ZERO_ERROR;
        icu::CaseMap::utf8ToLower("", 0, piece(run, "Lowercase"), sink, nullptr, status);  // "": the root locale
        check(status, "Lowercase");
      }
      if (sigma == std::string_view::npos) break;
      out += kSmallSigma;
      at = sigma + kCapitalSigma.size();
    }
  }
};

// Strip: drops leading and/or trailing characters with Unicode's White_Space property (Rust's
// char::is_whitespace).
class Strip final : public NormalizerStep {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string_view in, std::string& out, SplitScratch&) const override {
    const auto* s = reinterpret_cast<const uint8_t*>(in.data());
    const auto n = static_cast<int64_t>(in.size());
    int64_t begin = 0, end = n;
    while (left_ && begin < end) {
      int64_t next = begin;
      UChar32 c;
      U8_NEXT_UNSAFE(s, next, c);  // valid UTF-8 (the tokenizer replaced invalid bytes)
      if (!u_isUWhiteSpace(c)) break;
      begin = next;
    }
    while (right_ && end > begin) {
      int64_t prev = end;
      UChar32 c;
      U8_BACK_1_UNSAFE(s, prev);
      int64_t at = prev;
      U8_NEXT_UNSAFE(s, at, c);
      if (!u_isUWhiteSpace(c)) break;
      end = prev;
    }
    out.assign(in.substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin)));
  }

 private:
  bool left_, right_;
};

}  // namespace

std::unique_ptr<NormalizerStep> make_unicode_form(const std::string& form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = form == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                              : form == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                              : form == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                              : form == "NFKD" ? icu::Normalizer2::getNFKDInstance(status)
                                               : nullptr;
  if (!n && U_SUCCESS(status)) throw DataError(fmt::format("normalizer: unknown Unicode form '{}'", form));
  check(status, form.c_str());
  static const icu::UnicodeSet* const assigned_by_9 = [] {
    UErrorCode s = U_ZERO_ERROR;
    auto* set = new icu::UnicodeSet(icu::UnicodeString(kNormalizationUnicodeAge, -1, US_INV), s);
    check(s, "Unicode 9.0 character set");
    set->freeze();  // frozen sets are safe to share between threads
    return set;
  }();
  return std::make_unique<UnicodeForm>(*n, *assigned_by_9, form);
}

std::unique_ptr<NormalizerStep> make_lowercase() { return std::make_unique<Lowercase>(); }

std::unique_ptr<NormalizerStep> make_strip(bool left, bool right) { return std::make_unique<Strip>(left, right); }

}  // namespace mt
