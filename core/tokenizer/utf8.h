// utf8.h: making arbitrary bytes valid UTF-8 before Unicode-aware tokenization.
#pragma once
#include <string>
#include <string_view>

namespace mt {

// Returns `text` itself when it is valid UTF-8. Otherwise writes into `scratch` a copy in which every
// ill-formed sequence is replaced by U+FFFD, one per maximal subpart (Unicode's recommended practice, which
// Python's bytes.decode("utf-8", errors="replace") follows), and returns a view of scratch.
std::string_view valid_utf8(std::string_view text, std::string& scratch);

}  // namespace mt
