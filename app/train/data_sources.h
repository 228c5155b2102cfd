// data_sources.h: the training and validation sample sources a config asks for, and batch assembly.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/tensor/tensor.h"

namespace mt::app {

// Writes global sample g (seq_length + 1 tokens) into out.
using SampleFn = std::function<void(int64_t g, std::span<int32_t> out)>;

struct DataSources {
  SampleFn train;
  SampleFn valid;  // empty when the config has no validation data
  // Supervised fine-tuning data (data.loss_mask): the loss mask of the same global samples (seq_length + 1 values,
  // 0 or 1, value j the mask of token j); empty when the split has no mask (every token's loss counts).
  SampleFn train_mask;
  SampleFn valid_mask;
  // data.sft_packing: pack: the position of each token of the same global samples within its document (seq_length
  // + 1 values, 0 at the sample's start and at every document start inside it); attention and position ids reset
  // where they do. Empty otherwise (positions 0, 1, ..., one causal sequence per sample).
  SampleFn train_positions;
  SampleFn valid_positions;
  int64_t train_samples = 0;  // samples per epoch (0 for synthetic: unbounded)
  int64_t valid_samples = 0;
  std::string description;  // one line for the log
};

// Throws ConfigError naming the key (data.train[i] / data.valid[i]) when a dataset's .bin or .idx file is
// missing: checked before training starts, where the error is not buried under the resolved config. With
// `verify_checksums` (one process of a job: rank 0) and data.verify_checksums, every dataset that has a
// PREFIX.crc32c is checked against it too: a DataError naming the key, the file and the chunk that differs.
// Then check_data_tokenizers.
void check_data_files(const Config& cfg, bool verify_checksums);

// The datasets of data.train and data.valid that have a tokenizer record (PREFIX.tokenizer.yaml) must agree with
// the first one: a blend or concatenation of ids made by different tokenizers is refused (DataError naming both
// keys, their sidecars and what differs) unless data.allow_tokenizer_change, which turns it into a warning.
void check_data_tokenizers(const Config& cfg);

// The rule of check_data_tokenizers for two tokenizer records (sidecar files) `a_path` and `b_path`, named in
// messages as a_what and b_what; nothing when either file does not exist.
void check_same_tokenizer(const std::string& a_what, const std::string& a_path, const std::string& b_what,
                          const std::string& b_path, const Config& cfg);

// Opens the datasets named by cfg.data (or the synthetic source); throws DataError / ConfigError naming
// the file or key. Every token is checked against model.vocab_size as samples are read.
DataSources open_data_sources(const Config& cfg);

// The samples of the datasets at `prefixes` (all documents) in file order: sample j is tokens
// [j*S, j*S + S] of the documents concatenated. `count` receives the number of samples. With `verify_checksums`
// every dataset that has a PREFIX.crc32c is checked against it first, as training checks its data: a DataError
// naming the file and the chunk that differs.
SampleFn file_order_source(const std::vector<std::string>& prefixes, int64_t seq_length, int64_t vocab_size,
                           int64_t& count, bool verify_checksums);

// Samples [first, first + B) of the mask source `mask` as the loss weights of their targets (B * S), f32:
// weight * mask[j + 1] for target j of a sample. Returns the number of targets whose mask is 1.
int64_t make_loss_weights(const SampleFn& mask, int64_t first, int64_t batch, int64_t seq_length, float weight,
                          Tensor& weights);

// The number of targets whose mask is 1 in samples [first, first + count) of the mask source `mask`.
int64_t count_loss_targets(const SampleFn& mask, int64_t first, int64_t count, int64_t seq_length);

// Samples [first, first + B) of the positions source `positions` as the position ids (B, S) i32 of their input
// tokens (the first S of each sample's S + 1 values).
void make_positions(const SampleFn& positions, int64_t first, int64_t batch, int64_t seq_length, Tensor& out);

// Samples [first, first + B) of `source` as tokens (B, S) and targets (B, S), i32.
void make_batch(const SampleFn& source, int64_t first, int64_t batch, int64_t seq_length, Tensor& tokens,
                Tensor& targets);

}  // namespace mt::app
