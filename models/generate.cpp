#include "models/generate.h"

#include <stdexcept>

#include <fmt/format.h>

#include "core/tensor/finite.h"

namespace mt {
namespace {

// NaN logits sample some id as if it meant something (greedy: id 0): refused, saying where.
void check_finite_logits(std::span<const float> logits, int64_t position) {
  if (const NonFinite n = find_nonfinite(logits))
    throw std::runtime_error(fmt::format(
        "generate: the logits after {} tokens are not finite: {}: the model's weights hold inf or NaN (`megatrain "
        "ckpt inspect --verify` of the checkpoint names them), or its precision overflows",
        position, describe(n, static_cast<int64_t>(logits.size()))));
}

}  // namespace

GenerateResult generate(KvCacheDecoder& decoder, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt has no tokens");
  if (opt.max_new_tokens < 1)
    throw std::invalid_argument(fmt::format("--max-new-tokens {}: must be >= 1", opt.max_new_tokens));
  if (static_cast<int64_t>(prompt.size()) > decoder.capacity())
    throw std::invalid_argument(fmt::format("generate: the prompt has {} tokens, more than the model's context of {}",
                                            prompt.size(), decoder.capacity()));
  check_sampling_options(opt.sampling);
  decoder.reset();
  GenerateResult r;
  std::vector<float> logits = decoder.feed(prompt);  // (V) of the prompt's last position
  for (int64_t step = 0;; ++step) {
    check_finite_logits(logits, decoder.length());
    const int32_t next = sample_token(logits, opt.sampling, static_cast<uint64_t>(step));
    r.tokens.push_back(next);
    if (on_token) on_token(next);
    if (next == opt.stop_id) {
      r.stop = StopReason::end_of_document;
      break;
    }
    if (static_cast<int64_t>(r.tokens.size()) >= opt.max_new_tokens) {
      r.stop = StopReason::max_new_tokens;
      break;
    }
    if (decoder.length() >= decoder.capacity()) {
      r.stop = StopReason::context_full;
      break;
    }
    const int32_t one[1] = {next};
    logits = decoder.feed(one);
  }
  return r;
}

}  // namespace mt
