#include "app/data_sources.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/data/gpt_dataset.h"
#include "core/data/indexed_dataset.h"

namespace mt::app {

namespace {

// Wraps a sample source with the check that every token is a valid id for the model.
SampleFn checked(SampleFn inner, int64_t vocab_size, std::string what) {
  return [inner = std::move(inner), vocab_size, what = std::move(what)](int64_t g, std::span<int32_t> out) {
    inner(g, out);
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i] < 0 || out[i] >= vocab_size)
        throw DataError(fmt::format("{}: sample {} holds token id {}, outside model.vocab_size={}", what, g, out[i],
                                    vocab_size));
  };
}

}  // namespace

DataSources open_data_sources(const Config& cfg) {
  DataSources ds;
  const int64_t S = cfg.model.seq_length;
  const uint64_t seed = static_cast<uint64_t>(cfg.training.seed);
  if (cfg.data.synthetic) {
    auto train = std::make_shared<SyntheticDataset>(cfg.model.vocab_size, S, seed);
    auto valid = std::make_shared<SyntheticDataset>(cfg.model.vocab_size, S, seed + 1);
    ds.train = [train](int64_t g, std::span<int32_t> out) { train->sample(g, out); };
    ds.valid = [valid](int64_t g, std::span<int32_t> out) { valid->sample(g, out); };
    ds.description = fmt::format("synthetic tokens in [0, {})", cfg.model.vocab_size);
    return ds;
  }

  std::vector<TokenStream::Part> train_parts, valid_parts;
  for (const std::string& prefix : cfg.data.train) {
    auto d = std::make_shared<const IndexedDataset>(prefix);
    auto ranges = split_documents(d->num_documents(), cfg.data.split);
    train_parts.push_back({d, ranges[0].first, ranges[0].second});
    if (cfg.data.valid.empty()) valid_parts.push_back({d, ranges[1].first, ranges[1].second});
  }
  for (const std::string& prefix : cfg.data.valid) {
    auto d = std::make_shared<const IndexedDataset>(prefix);
    valid_parts.push_back({d, 0, d->num_documents()});
  }
  auto train_stream = std::make_shared<const TokenStream>(train_parts);
  auto valid_stream = std::make_shared<const TokenStream>(valid_parts);
  if (train_stream->num_tokens() < S + 1)
    throw DataError(fmt::format("data.train: the training split holds {} tokens, fewer than one sample of "
                                "model.seq_length+1={} tokens",
                                train_stream->num_tokens(), S + 1));
  auto train = std::make_shared<GptDataset>(train_stream, S, seed, true);
  ds.train = checked([train](int64_t g, std::span<int32_t> out) { train->sample(g, out); }, cfg.model.vocab_size,
                     "data.train");
  ds.train_samples = train->samples_per_epoch();
  if (valid_stream->num_tokens() >= S + 1) {
    auto valid = std::make_shared<GptDataset>(valid_stream, S, seed, true);
    ds.valid = checked([valid](int64_t g, std::span<int32_t> out) { valid->sample(g, out); }, cfg.model.vocab_size,
                       "data.valid");
    ds.valid_samples = valid->samples_per_epoch();
  }
  ds.description = fmt::format("{} training samples per epoch ({} tokens), {} validation samples",
                               ds.train_samples, train_stream->num_tokens(), ds.valid_samples);
  return ds;
}

SampleFn file_order_source(const std::vector<std::string>& prefixes, int64_t seq_length, int64_t vocab_size,
                           int64_t& count) {
  std::vector<TokenStream::Part> parts;
  for (const std::string& prefix : prefixes) {
    auto d = std::make_shared<const IndexedDataset>(prefix);
    parts.push_back({d, 0, d->num_documents()});
  }
  auto dataset = std::make_shared<GptDataset>(std::make_shared<const TokenStream>(parts), seq_length, 0, false);
  count = dataset->samples_per_epoch();
  return checked([dataset](int64_t g, std::span<int32_t> out) { dataset->sample(g, out); }, vocab_size,
                 fmt::format("{}", fmt::join(prefixes, ",")));
}

void make_batch(const SampleFn& source, int64_t first, int64_t batch, int64_t seq_length, Tensor& tokens,
                Tensor& targets) {
  std::vector<int32_t> buf(static_cast<size_t>(seq_length + 1));
  int32_t* tok = tokens.data<int32_t>();
  int32_t* tgt = targets.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    source(first + b, buf);
    std::copy(buf.begin(), buf.end() - 1, tok + b * seq_length);
    std::copy(buf.begin() + 1, buf.end(), tgt + b * seq_length);
  }
}

}  // namespace mt::app
