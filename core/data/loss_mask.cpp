// loss_mask.cpp: opening a token dataset with its loss mask, and the check that they go together.
#include "core/data/loss_mask.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/tokenizer/chat_template.h"

namespace mt {

void check_loss_mask_matches(const IndexedDataset& tokens, const IndexedDataset& mask) {
  const auto mismatch = [&](const std::string& what) {
    return DataError(fmt::format("the loss mask {}.bin/.idx does not match the tokens {}.bin/.idx: {}", mask.prefix(),
                                 tokens.prefix(), what));
  };
  if (tokens.num_documents() != mask.num_documents())
    throw mismatch(fmt::format("{} documents vs {}", mask.num_documents(), tokens.num_documents()));
  if (tokens.num_sequences() != mask.num_sequences())
    throw mismatch(fmt::format("{} sequences vs {}", mask.num_sequences(), tokens.num_sequences()));
  const auto td = tokens.document_index(), md = mask.document_index();
  if (!std::equal(td.begin(), td.end(), md.begin(), md.end()))
    throw mismatch("the documents are made of different sequences");
  const auto tl = tokens.sequence_lengths(), ml = mask.sequence_lengths();
  for (size_t i = 0; i < tl.size(); ++i)
    if (tl[i] != ml[i]) throw mismatch(fmt::format("sequence {} has {} mask values for {} tokens", i, ml[i], tl[i]));
  std::vector<int32_t> values;
  for (int64_t s = 0; s < mask.num_sequences(); ++s) {
    values.resize(static_cast<size_t>(ml[s]));
    mask.read(s, 0, values);
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i] != 0 && values[i] != 1)
        throw mismatch(fmt::format("sequence {}, token {} has mask value {} (expected 0 or 1)", s, i, values[i]));
  }
}

TokensWithLossMask open_tokens_with_loss_mask(const std::string& prefix) {
  TokensWithLossMask d;
  d.tokens = std::make_unique<IndexedDataset>(prefix);
  d.mask = std::make_unique<IndexedDataset>(loss_mask_prefix(prefix));
  check_loss_mask_matches(*d.tokens, *d.mask);
  return d;
}

}  // namespace mt
