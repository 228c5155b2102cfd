// gpt_dataset.h: training samples of seq_length + 1 tokens cut from a document stream, in a global
// order fixed by the seed and independent of the parallel layout.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/data/indexed_dataset.h"

namespace mt {

// The tokens of documents [doc_begin, doc_end) (or, with unit = sequences, of sequences [doc_begin, doc_end),
// the unit megatron-core splits GPT data by) of one or more indexed datasets, concatenated in file order
// (dataset by dataset, sequence by sequence). Sample j of the stream is tokens [j*S, j*S + S] (S + 1 tokens:
// the first S are the input, the last S the targets); there are (tokens - 1) / S of them.
class TokenStream {
 public:
  enum class Unit { documents, sequences };
  struct Part {
    std::shared_ptr<const IndexedDataset> dataset;
    int64_t doc_begin = 0, doc_end = 0;  // documents, or sequences with unit = sequences
    Unit unit = Unit::documents;
  };
  explicit TokenStream(std::vector<Part> parts);
  int64_t num_tokens() const { return total_; }
  // The stream's non-empty sequences, in order: sequence i is tokens [start, start + length).
  int64_t num_sequences() const { return static_cast<int64_t>(runs_.size()); }
  std::pair<int64_t, int64_t> sequence_span(int64_t i) const {
    const Run& r = runs_.at(static_cast<size_t>(i));
    return {r.start, r.length};
  }
  // Tokens [begin, begin + out.size()) of the stream.
  void read(int64_t begin, std::span<int32_t> out) const;
  // Where stream token `pos` is read from, for a message: "PREFIX.bin: sequence 3, token 5".
  std::string where(int64_t pos) const;
  // The positions of the same tokens within their sequences (documents), counted from `begin` where a sequence
  // started before it: out[k] = begin + k - max(start of the sequence holding token begin + k, begin). A packed
  // sample's position ids, which restart at 0 at every document boundary (data.sft_packing: pack).
  void read_positions(int64_t begin, std::span<int32_t> out) const;

 private:
  std::vector<Part> parts_;
  // Per sequence of all parts, in order: (dataset part, sequence index, first stream position).
  struct Run {
    int32_t part;
    int64_t sequence;
    int64_t start;
    int64_t length;
  };
  std::vector<Run> runs_;
  int64_t total_ = 0;
  // The index of the last run starting at or before stream position `pos` (of a checked, non-empty read).
  size_t run_at(int64_t pos) const;
  // Checks the read of `count` tokens from `begin` (naming `what` if it leaves the stream) and calls
  // piece(run, offset in its sequence, tokens done before, tokens taken) for each run it crosses, in order.
  template <class Piece>
  void for_each_piece(int64_t begin, int64_t count, const char* what, Piece&& piece) const;
};

// Samples of a token stream. Global sample g lives in epoch g / n (n samples per epoch) and is
// sample perm_epoch(g mod n) of the stream, perm a seeded shuffle per epoch (file order with shuffle off).
// The shuffle is a Fisher-Yates pass whose draw i is random_u64_at(seed, stream_id("data.shuffle") + epoch, i),
// so the order is the same on every machine and for every parallel layout. The current epoch's permutation
// is cached; sample() locks around the cache, so one dataset may be shared by several threads.
// With cut = sequences (supervised fine-tuning, data.sft_packing: pad), sample j is instead sequence j of the stream
// (one conversation), its first seq_length + 1 tokens, the rest 0 (padding; its loss mask is 0 too).
class GptDataset {
 public:
  enum class Cut { stream, sequences };
  GptDataset(std::shared_ptr<const TokenStream> stream, int64_t seq_length, uint64_t seed, bool shuffle,
             Cut cut = Cut::stream);
  int64_t samples_per_epoch() const { return n_; }
  int64_t seq_length() const { return seq_length_; }
  // out holds seq_length + 1 tokens.
  void sample(int64_t global_index, std::span<int32_t> out) const;
  // The position of each of those tokens within its document (TokenStream::read_positions, from 0 at the sample's
  // start); with cut = sequences the sample is one document: 0, 1, ..., seq_length.
  void sample_positions(int64_t global_index, std::span<int32_t> out) const;
  // Where token `token` (< seq_length + 1) of global sample g is read from (TokenStream::where); "padding" for the
  // zeros after a short sequence (cut = sequences).
  std::string where(int64_t global_index, int64_t token) const;
  // Stream sample (in file order) that global sample g reads.
  int64_t stream_sample(int64_t global_index) const;
  // The permutation of one epoch: element i is the stream sample read at position i of the epoch.
  std::vector<int64_t> epoch_permutation(int64_t epoch) const;

 private:
  std::shared_ptr<const TokenStream> stream_;
  int64_t seq_length_;
  uint64_t seed_;
  bool shuffle_;
  Cut cut_;
  int64_t n_;
  mutable std::mutex mutex_;  // guards the cache below
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

// Random tokens in [0, vocab_size) keyed by (seed, sample, position): a data source for benchmarks.
class SyntheticDataset {
 public:
  SyntheticDataset(int64_t vocab_size, int64_t seq_length, uint64_t seed);
  void sample(int64_t global_index, std::span<int32_t> out) const;
  int64_t seq_length() const { return seq_length_; }

 private:
  int64_t vocab_size_, seq_length_;
  uint64_t seed_;
};

// Train / valid / test ranges of [0, num_elements) from split weights, exactly as megatron-core (0.16.1,
// megatron/core/datasets/blended_megatron_dataset_config.py parse_and_normalize_split and
// convert_split_vector_to_split_matrix, blended_megatron_dataset_builder.py _build_megatron_dataset_splits):
// the weights padded to 3 with zeros and normalized (numpy's w / sum(w)), the bookends 0, w0, w0+w1, w0+w1+w2
// summed left to right, and range i = [round(b_i * N), round(b_{i+1} * N)) with Python's round (half to even).
// For GPT data megatron-core counts sequences (numel_low_level_dataset), not documents. Returns 3 (begin, end)
// pairs; a zero weight gives an empty range. Throws std::invalid_argument for more than 3 weights, a negative
// weight or a zero sum.
std::vector<std::pair<int64_t, int64_t>> split_ranges(int64_t num_elements, const std::vector<double>& weights);

}  // namespace mt
