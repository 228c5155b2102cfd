// generate.h: the autoregressive loop: prefill the prompt into a KvCacheDecoder, then choose one token at a
// time (models/sampling.h) and feed it back, until the end-of-document id, the token budget or a full context.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "models/kv_cache_decoder.h"
#include "models/sampling.h"

namespace mt {

struct GenerateOptions {
  int64_t max_new_tokens = 64;  // >= 1
  SamplingOptions sampling;
  int32_t stop_id = -1;  // the end-of-document id: generation stops after producing it; -1: none
};

enum class StopReason { end_of_document, max_new_tokens, context_full };

struct GenerateResult {
  std::vector<int32_t> tokens;  // the new tokens, the stop id included when it ended the text
  StopReason stop = StopReason::max_new_tokens;
};

// Runs from an empty cache (the decoder is reset first). `on_token` sees each new token as it is chosen.
// Throws std::invalid_argument for an empty prompt or one that does not fit in the decoder's cache, and
// std::runtime_error when the logits to sample from hold inf or NaN (saying how many and where).
GenerateResult generate(KvCacheDecoder& decoder, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace mt
