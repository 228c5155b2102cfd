// inspect.cpp: `megatrain data inspect`, a summary of one indexed dataset.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>

#include "core/data/prepare.h"
#include "core/tokenizer/tokenizer_sidecar.h"
#include "core/tokenizer/utf8.h"

namespace mt {

namespace {

constexpr int64_t kShownTokens = 64;

// Byte-tokenizer ids as readable text: printable ASCII and UTF-8 bytes as they are, other bytes escaped,
// the end-of-document id 256 as <eod>.
std::string as_text(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens) {
    if (t == 256)
      s += "<eod>";
    else if (t == '\n')
      s += "\\n";
    else if (t == '\t')
      s += "\\t";
    else if (t == '\\')
      s += "\\\\";
    else if (t < 0x20 || t == 0x7f)
      s += fmt::format("\\x{:02x}", t);
    else
      s += static_cast<char>(t);
  }
  return s;
}

// The first `count` documents as text, decoded by the tokenizer PREFIX.tokenizer.yaml names.
std::string decoded_documents(const std::string& prefix, const IndexedDataset& ds, int64_t count) {
  const std::optional<TokenizerSidecar> sidecar = read_tokenizer_sidecar(prefix);
  if (!sidecar)
    throw DataError(fmt::format("{}: --decode needs the tokenizer, and {} does not exist (data prepare writes it)",
                                prefix, tokenizer_sidecar_path(prefix)));
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(sidecar->tokenizer);
  if (tok->vocab_size() != sidecar->vocab_size || tok->eod() != sidecar->eod)
    throw DataError(
        fmt::format("{}: the {} tokenizer loaded from its files has vocab_size {} and eod {}, the "
                    "dataset was written with {} and {}: the files changed",
                    tokenizer_sidecar_path(prefix), name_of(tok->kind()), tok->vocab_size(), tok->eod(),
                    sidecar->vocab_size, sidecar->eod));
  auto docs = ds.document_index();
  auto lengths = ds.sequence_lengths();
  std::string out, scratch;
  for (int64_t d = 0; d < std::min(count, ds.num_documents()); ++d) {
    std::vector<int32_t> ids;
    for (int64_t s = docs[d]; s < docs[d + 1]; ++s) {
      const size_t at = ids.size();
      ids.resize(at + static_cast<size_t>(lengths[s]));
      ds.read(s, 0, std::span<int32_t>(ids).subspan(at));
    }
    const std::string bytes = tok->decode(ids);
    out += fmt::format("--- document {} ({} tokens, decoded by {}) ---\n{}\n", d, ids.size(), name_of(tok->kind()),
                       valid_utf8(bytes, scratch));
  }
  return out;
}

}  // namespace

std::string inspect_dataset(const std::string& prefix, int64_t sample_docs, int64_t decode_docs) {
  const IndexedDataset ds(prefix);
  auto docs = ds.document_index();
  auto lengths = ds.sequence_lengths();
  const int64_t D = ds.num_documents();

  int64_t min_len = std::numeric_limits<int64_t>::max(), max_len = 0;
  std::vector<int64_t> doc_tokens(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    int64_t n = 0;
    for (int64_t s = docs[d]; s < docs[d + 1]; ++s) n += lengths[s];
    doc_tokens[static_cast<size_t>(d)] = n;
    min_len = std::min(min_len, n);
    max_len = std::max(max_len, n);
  }

  std::string out = fmt::format("{}: Megatron indexed dataset\n", prefix);
  out += fmt::format("  dtype       {} (code {}, {} bytes per token)\n", token_dtype_name(ds.dtype()),
                     static_cast<int>(ds.dtype()), token_dtype_size(ds.dtype()));
  out += fmt::format("  sequences   {}\n", ds.num_sequences());
  out += fmt::format("  documents   {}\n", D);
  out += fmt::format("  tokens      {}\n", ds.num_tokens());
  if (D > 0)
    out += fmt::format("  doc length  min {} / mean {:.1f} / max {} tokens\n", min_len,
                       static_cast<double>(ds.num_tokens()) / static_cast<double>(D), max_len);

  for (int64_t d = 0; d < std::min(sample_docs, D); ++d) {
    // The first tokens of document d, across its sequences.
    std::vector<int32_t> shown;
    for (int64_t s = docs[d]; s < docs[d + 1] && static_cast<int64_t>(shown.size()) < kShownTokens; ++s) {
      const int64_t take = std::min<int64_t>(lengths[s], kShownTokens - static_cast<int64_t>(shown.size()));
      const size_t at = shown.size();
      shown.resize(at + static_cast<size_t>(take));
      ds.read(s, 0, std::span<int32_t>(shown).subspan(at));
    }
    const int64_t n = doc_tokens[static_cast<size_t>(d)];
    out += fmt::format("  document {} ({} tokens, {} sequences){}: [{}]\n", d, n, docs[d + 1] - docs[d],
                       static_cast<int64_t>(shown.size()) < n ? fmt::format(", first {}", shown.size()) : "",
                       fmt::join(shown, ", "));
    const bool bytes = std::all_of(shown.begin(), shown.end(), [](int32_t t) { return t >= 0 && t <= 256; });
    if (bytes && !shown.empty()) out += fmt::format("    as bytes: \"{}\"\n", as_text(shown));
  }
  if (decode_docs > 0) out += decoded_documents(prefix, ds, decode_docs);
  return out;
}

}  // namespace mt
