// utf8.cpp: UTF-8 validation with U+FFFD substitution of maximal subparts (Unicode 15, table 3-7).
#include "core/tokenizer/utf8.h"

#include <cstdint>

namespace mt {

namespace {

// Length of the well-formed sequence at text[i], or 0 with `bad` set to the length of the maximal subpart
// (at least 1) to replace.
size_t well_formed_length(std::string_view text, size_t i, size_t& bad) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = b(i);
  if (lead < 0x80) return 1;
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    bad = 1;  // 80..C1, F5..FF never start a sequence
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    const bool ok =
        i + k < text.size() && (k == 1 ? (b(i + k) >= lo && b(i + k) <= hi) : (b(i + k) >= 0x80 && b(i + k) <= 0xBF));
    if (!ok) {
      bad = k;  // the lead and the continuation bytes that were still possible
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

std::string_view valid_utf8(std::string_view text, std::string& scratch) {
  size_t i = 0, bad = 0;
  while (i < text.size()) {
    const size_t n = well_formed_length(text, i, bad);
    if (n == 0) break;
    i += n;
  }
  if (i == text.size()) return text;
  scratch.assign(text.substr(0, i));
  while (i < text.size()) {
    const size_t n = well_formed_length(text, i, bad);
    if (n > 0) {
      scratch.append(text.substr(i, n));
      i += n;
    } else {
      scratch.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return scratch;
}

}  // namespace mt
