// hf_tokenizer_export.h: the tokenizer half of a Hugging Face export. A checkpoint records the tokenizer of
// its training data as tokenizer.yaml (a copy of data prepare's PREFIX.tokenizer.yaml, see
// core/tokenizer/tokenizer_sidecar.h); `ckpt export --format hf` turns it into the files AutoTokenizer reads, so
// the exported model's ids mean what they meant in training.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer_sidecar.h"

namespace mt {

inline constexpr const char* kCheckpointTokenizerFile = "tokenizer.yaml";

// The bos / eos ids an export states, in config.json and generation_config.json alike.
struct HfSpecialIds {
  int32_t bos = 0;
  int32_t eos = 0;
};

// The tokenizer's bos / eos ids: eos is the eod id; bos is the eod id too, except for SentencePiece, whose model
// names its bos (read from the .model; the eod id when it has none), and for an hf tokenizer.json whose
// post-processor put a special token before each document (Llama-3's <|begin_of_text|>; not with `data prepare
// --no-special-tokens`). Throws CheckpointError naming the file.
HfSpecialIds hf_special_ids(const TokenizerSidecar& sidecar);

// Writes into out_dir, by sidecar kind:
//   byte:          tokenizer.json (the 256 bytes as GPT-2's byte-level alphabet, no merges, so id i is byte i;
//                  the eod id an added special token <|endoftext|>)
//   gpt2:          vocab.json + merges.txt copied, and tokenizer.json built from them (byte-level BPE)
//   hf:            the tokenizer.json copied (without its post-processor when the data was prepared without
//                  the special tokens it adds)
//   sentencepiece: tokenizer.json built from the .model (hf_spm_tokenizer.h: encodes as sentencepiece does,
//                  up to float32 ties of unigram scores) and the .model copied as tokenizer.model
// and tokenizer_config.json (PreTrainedTokenizerFast, model_max_length) and special_tokens_map.json: bos/eos/
// unk/pad all the eod token, except for SentencePiece, whose model names bos, unk and pad (pad: the eod
// token when it has none) and whose texts keep "<s>" as text (split_special_tokens); generation_config.json
// with hf_special_ids (config.json, from export_hf, states the same ids). Returns the file
// names written. Throws CheckpointError (FileError for a failed write) naming the file on failure.
std::vector<std::string> export_hf_tokenizer(const TokenizerSidecar& sidecar, const std::string& out_dir,
                                             int64_t model_max_length);

}  // namespace mt
