// loss_mask.h: a token dataset with its per-token loss mask (supervised fine-tuning data), opened and checked
// together, as training reads them.
#pragma once
#include <memory>
#include <string>

#include "core/data/indexed_dataset.h"

namespace mt {

struct TokensWithLossMask {
  std::unique_ptr<IndexedDataset> tokens;  // PREFIX
  std::unique_ptr<IndexedDataset> mask;    // loss_mask_prefix(PREFIX): 1 where a token's loss counts, 0 elsewhere
};

// Throws DataError naming both datasets unless they match: the same number of documents and sequences, the same
// length of every sequence, and a mask holding only 0 and 1 (every mask token is read).
void check_loss_mask_matches(const IndexedDataset& tokens, const IndexedDataset& mask);

// Opens PREFIX and PREFIX_mask (chat_template.h's loss_mask_prefix) and checks they match.
TokensWithLossMask open_tokens_with_loss_mask(const std::string& prefix);

}  // namespace mt
