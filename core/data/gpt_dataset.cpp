// gpt_dataset.cpp: the document token stream, seeded per-epoch sample order, synthetic tokens and splits.
#include "core/data/gpt_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "core/base/rng.h"

namespace mt {

namespace {

// A uniform integer in [0, bound) from 64 random bits (multiply-high: no modulo, bias below 2^-40 here).
uint64_t below(uint64_t random, uint64_t bound) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(random) * bound) >> 64);
}

}  // namespace

// ---------------------------------------------------------------- TokenStream

TokenStream::TokenStream(std::vector<Part> parts) : parts_(std::move(parts)) {
  for (size_t p = 0; p < parts_.size(); ++p) {
    const Part& part = parts_[p];
    if (!part.dataset) throw std::invalid_argument(fmt::format("TokenStream: part {} has no dataset", p));
    const IndexedDataset& d = *part.dataset;
    const bool by_sequence = part.unit == Unit::sequences;
    const int64_t limit = by_sequence ? d.num_sequences() : d.num_documents();
    if (part.doc_begin < 0 || part.doc_begin > part.doc_end || part.doc_end > limit)
      throw DataError(fmt::format("{}: {} range [{}, {}) is outside the dataset's {} {}", d.prefix(),
                                  by_sequence ? "sequence" : "document", part.doc_begin, part.doc_end, limit,
                                  by_sequence ? "sequences" : "documents"));
    auto docs = d.document_index();
    auto lengths = d.sequence_lengths();
    const int64_t first = by_sequence ? part.doc_begin : docs[part.doc_begin];
    const int64_t last = by_sequence ? part.doc_end : docs[part.doc_end];
    for (int64_t s = first; s < last; ++s) {
      if (lengths[s] == 0) continue;  // empty sequences hold no stream position
      runs_.push_back(Run{static_cast<int32_t>(p), s, total_, lengths[s]});
      total_ += lengths[s];
    }
  }
}

size_t TokenStream::run_at(int64_t pos) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), pos, [](int64_t p, const Run& r) { return p < r.start; });
  return static_cast<size_t>(it - runs_.begin()) - 1;
}

template <class Piece>
void TokenStream::for_each_piece(int64_t begin, int64_t count, const char* what, Piece&& piece) const {
  if (begin < 0 || count > total_ - begin)
    throw std::out_of_range(
        fmt::format("TokenStream: {} of tokens [{}, {}) outside the stream's {}", what, begin, begin + count, total_));
  if (count == 0) return;
  int64_t done = 0, pos = begin;
  for (size_t r = run_at(begin); done < count; ++r) {
    const Run& run = runs_[r];
    const int64_t offset = pos - run.start;
    const int64_t take = std::min(run.length - offset, count - done);
    piece(run, offset, done, take);
    done += take;
    pos += take;
  }
}

void TokenStream::read(int64_t begin, std::span<int32_t> out) const {
  for_each_piece(begin, static_cast<int64_t>(out.size()), "read",
                 [&](const Run& run, int64_t offset, int64_t done, int64_t take) {
                   parts_[run.part].dataset->read(run.sequence, offset, out.subspan(done, take));
                 });
}

std::string TokenStream::where(int64_t pos) const {
  if (pos < 0 || pos >= total_) return fmt::format("stream position {} (outside the stream)", pos);
  const Run& run = runs_[run_at(pos)];
  return fmt::format("{}.bin: sequence {}, token {}", parts_[run.part].dataset->prefix(), run.sequence,
                     pos - run.start);
}

// A document's positions count from 0 at its start, or at the read's start for the document the read begins in.
void TokenStream::read_positions(int64_t begin, std::span<int32_t> out) const {
  for_each_piece(begin, static_cast<int64_t>(out.size()), "positions",
                 [&](const Run&, int64_t, int64_t done, int64_t take) {
                   for (int64_t i = 0; i < take; ++i) out[static_cast<size_t>(done + i)] = static_cast<int32_t>(i);
                 });
}

// ---------------------------------------------------------------- GptDataset

GptDataset::GptDataset(std::shared_ptr<const TokenStream> stream, int64_t seq_length, uint64_t seed, bool shuffle,
                       Cut cut)
    : stream_(std::move(stream)), seq_length_(seq_length), seed_(seed), shuffle_(shuffle), cut_(cut) {
  if (!stream_) throw std::invalid_argument("GptDataset: no token stream");
  if (seq_length_ <= 0) throw std::invalid_argument(fmt::format("GptDataset: seq_length {} <= 0", seq_length_));
  if (cut_ == Cut::sequences)
    n_ = stream_->num_sequences();
  else
    n_ = stream_->num_tokens() > 0 ? (stream_->num_tokens() - 1) / seq_length_ : 0;
}

std::vector<int64_t> GptDataset::epoch_permutation(int64_t epoch) const {
  std::vector<int64_t> perm(static_cast<size_t>(n_));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (!shuffle_) return perm;
  const uint64_t stream = stream_id("data.shuffle") + static_cast<uint64_t>(epoch);
  for (int64_t i = n_ - 1; i > 0; --i) {
    const uint64_t j = below(random_u64_at(seed_, stream, static_cast<uint64_t>(i)), static_cast<uint64_t>(i) + 1);
    std::swap(perm[static_cast<size_t>(i)], perm[j]);
  }
  return perm;
}

std::string GptDataset::where(int64_t global_index, int64_t token) const {
  if (cut_ == Cut::stream) return stream_->where(stream_sample(global_index) * seq_length_ + token);
  const auto [start, length] = stream_->sequence_span(stream_sample(global_index));
  return token < length ? stream_->where(start + token) : "padding";
}

int64_t GptDataset::stream_sample(int64_t global_index) const {
  if (global_index < 0) throw std::out_of_range(fmt::format("GptDataset: sample {} < 0", global_index));
  if (n_ == 0)
    throw DataError(fmt::format("the token stream holds {} tokens, fewer than one sample of seq_length+1={}",
                                stream_->num_tokens(), seq_length_ + 1));
  const int64_t epoch = global_index / n_, i = global_index % n_;
  if (!shuffle_) return i;
  std::lock_guard<std::mutex> lock(mutex_);
  if (cached_epoch_ != epoch) {
    perm_ = epoch_permutation(epoch);
    cached_epoch_ = epoch;
  }
  return perm_[static_cast<size_t>(i)];
}

void GptDataset::sample(int64_t global_index, std::span<int32_t> out) const {
  if (static_cast<int64_t>(out.size()) != seq_length_ + 1)
    throw std::invalid_argument(
        fmt::format("GptDataset: sample buffer holds {} tokens, need seq_length+1={}", out.size(), seq_length_ + 1));
  if (cut_ == Cut::stream) return stream_->read(stream_sample(global_index) * seq_length_, out);
  const auto [start, length] = stream_->sequence_span(stream_sample(global_index));
  const size_t take = static_cast<size_t>(std::min<int64_t>(length, seq_length_ + 1));
  stream_->read(start, out.first(take));
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(take), out.end(), 0);
}

// ---------------------------------------------------------------- SyntheticDataset

SyntheticDataset::SyntheticDataset(int64_t vocab_size, int64_t seq_length, uint64_t seed)
    : vocab_size_(vocab_size), seq_length_(seq_length), seed_(seed) {
  if (vocab_size_ <= 0 || seq_length_ <= 0)
    throw std::invalid_argument(
        fmt::format("SyntheticDataset: vocab_size {} and seq_length {} must be > 0", vocab_size_, seq_length_));
}

void GptDataset::sample_positions(int64_t global_index, std::span<int32_t> out) const {
  if (static_cast<int64_t>(out.size()) != seq_length_ + 1)
    throw std::invalid_argument(fmt::format("GptDataset: sample positions buffer holds {} values, need seq_length+1={}",
                                            out.size(), seq_length_ + 1));
  if (cut_ == Cut::stream) return stream_->read_positions(stream_sample(global_index) * seq_length_, out);
  for (size_t t = 0; t < out.size(); ++t) out[t] = static_cast<int32_t>(t);
}

void SyntheticDataset::sample(int64_t global_index, std::span<int32_t> out) const {
  constexpr uint64_t stream = stream_id("data.synthetic");
  const uint64_t base = static_cast<uint64_t>(global_index) * static_cast<uint64_t>(seq_length_ + 1);
  for (size_t t = 0; t < out.size(); ++t)
    out[t] = static_cast<int32_t>(below(random_u64_at(seed_, stream, base + t), static_cast<uint64_t>(vocab_size_)));
}

// ---------------------------------------------------------------- split_ranges

std::vector<std::pair<int64_t, int64_t>> split_ranges(int64_t num_elements, const std::vector<double>& weights) {
  if (weights.empty() || weights.size() > 3)
    throw std::invalid_argument(
        fmt::format("data.split: expected 1 to 3 weights (train, valid, test), got {}", weights.size()));
  if (num_elements < 0) throw std::invalid_argument(fmt::format("split_ranges: {} elements", num_elements));
  for (double w : weights)
    if (!(w >= 0) || !std::isfinite(w))
      throw std::invalid_argument(fmt::format("data.split: weight {} is not a finite number >= 0", w));
  std::vector<double> w(weights);
  w.resize(3, 0.0);
  // numpy.sum of 3 float64 adds left to right from 0 (below its pairwise block of 8).
  const double sum = (0.0 + w[0]) + w[1] + w[2];
  if (!(sum > 0)) throw std::invalid_argument("data.split: the weights sum to 0");
  double bookend[4] = {0.0, 0.0, 0.0, 0.0};
  for (int i = 0; i < 3; ++i) bookend[i + 1] = bookend[i] + w[i] / sum;
  // int(round(b * float(N))): Python rounds half to even, which is nearbyint in the default rounding mode.
  int64_t idx[4];
  for (int i = 0; i < 4; ++i)
    idx[i] = static_cast<int64_t>(std::nearbyint(bookend[i] * static_cast<double>(num_elements)));
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int i = 0; i < 3; ++i) {
    // megatron-core builds no dataset for a zero-width bookend (its split matrix holds None).
    if (!(bookend[i + 1] > bookend[i]))
      out.emplace_back(idx[i], idx[i]);
    else
      out.emplace_back(idx[i], idx[i + 1]);
  }
  return out;
}

}  // namespace mt
