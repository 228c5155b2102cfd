#include "app/train/data_sources.h"

#include <functional>
#include <filesystem>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/data/blend.h"
#include "core/tokenizer/chat_template.h"
#include "core/data/dataset_checksums.h"
#include "core/data/gpt_dataset.h"
#include "core/data/indexed_dataset.h"
#include "core/data/loss_mask.h"
#include "core/tokenizer/tokenizer_sidecar.h"

namespace mt::app {

namespace {

// Where token i of sample g was read from ("PREFIX.bin: sequence 3, token 5"), for the message of a bad id.
using LocateFn = std::function<std::string(int64_t g, int64_t i)>;

// Wraps a sample source with the check that every token is a valid id for the model; a bad one is named with the
// data file it came from.
SampleFn checked(SampleFn inner, int64_t vocab_size, std::string what, LocateFn locate) {
  return [inner = std::move(inner), vocab_size, what = std::move(what), locate = std::move(locate)](
             int64_t g, std::span<int32_t> out) {
    inner(g, out);
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i] < 0 || out[i] >= vocab_size)
        throw DataError(fmt::format("{}: sample {} holds token id {} (read from {}), outside model.vocab_size={}", what,
                                    g, out[i], locate(g, static_cast<int64_t>(i)), vocab_size));
  };
}

// checked() over one GptDataset.
SampleFn checked(std::shared_ptr<const GptDataset> dataset, int64_t vocab_size, std::string what) {
  return checked([dataset](int64_t g, std::span<int32_t> o) { dataset->sample(g, o); }, vocab_size, std::move(what),
                 [dataset](int64_t g, int64_t i) { return dataset->where(g, i); });
}

// The dataset against its checksum file; a mismatch names where the config or command line names it, and what
// skips the check (`skip`: for a dataset known to be fine whose checksums were lost or are stale).
void verify_checksums_at(const std::string& where, const std::string& prefix,
                         const char* skip = "data.verify_checksums=false") {
  try {
    verify_dataset_checksums(prefix);
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: {} ({} skips this check)", where, e.what(), skip));
  }
}

// Calls f(key, prefix) for every dataset of data.train, then of data.valid; key is where the config names it
// ("data.train[2]": a blend's prefixes are its odd items).
template <class F>
void each_dataset(const Config& cfg, F&& f) {
  for (const auto& [key, items] :
       {std::pair{"data.train", &cfg.data.train}, std::pair{"data.valid", &cfg.data.valid}}) {
    const DataBlend blend = parse_data_blend(*items);
    const size_t stride = blend.weights.empty() ? 1 : 2, offset = blend.weights.empty() ? 0 : 1;
    for (size_t i = 0; i < blend.prefixes.size(); ++i)
      f(fmt::format("{}[{}]", key, i * stride + offset), blend.prefixes[i]);
  }
}

}  // namespace

void check_data_files(const Config& cfg, bool verify_checksums) {
  if (cfg.data.synthetic) return;
  each_dataset(cfg, [&](const std::string& key, const std::string& prefix) {
    const std::string where = fmt::format("{}: {}", cfg.source, key);
    for (const char* ext : {".bin", ".idx"}) {
      const std::string file = prefix + ext;
      std::error_code ec;
      const auto status = std::filesystem::status(file, ec);
      if (!std::filesystem::exists(status))
        throw ConfigError(
            fmt::format("{}: no file {} (a dataset prefix names the pair {}.bin and {}.idx, written "
                        "by `megatrain data prepare`)",
                        where, file, prefix, prefix));
      // A FIFO or device would be read without end; the dataset reader refuses them too.
      if (!std::filesystem::is_regular_file(status))
        throw ConfigError(fmt::format("{}: {}: not a regular file (a directory, FIFO or device)", where, file));
    }
    // The loss mask beside a chat dataset (PREFIX_mask) is data read for training too, with its own checksums.
    if (verify_checksums && cfg.data.verify_checksums)
      for (const std::string& p : {prefix, loss_mask_prefix(prefix)}) verify_checksums_at(where, p);
  });
  check_data_tokenizers(cfg);
}

void check_same_tokenizer(const std::string& a_what, const std::string& a_path, const std::string& b_what,
                          const std::string& b_path, const Config& cfg) {
  const std::optional<TokenizerSidecar> a = read_tokenizer_sidecar_file(a_path),
                                        b = read_tokenizer_sidecar_file(b_path);
  if (!a || !b) return;  // nothing to compare (data prepared without a sidecar, a checkpoint saved without one)
  const std::vector<std::string> diff = tokenizer_differences(*a, *b);
  if (diff.empty()) return;
  const std::string what = fmt::format("{} ({}) and {} ({}) record different tokenizers ({})", a_what, a_path, b_what,
                                       b_path, fmt::join(diff, "; "));
  if (cfg.data.allow_tokenizer_change)
    return spdlog::warn("{}: training on anyway, as data.allow_tokenizer_change is true", what);
  throw DataError(
      fmt::format("{}: the same id would mean different tokens; prepare the data with one tokenizer, or set "
                  "data.allow_tokenizer_change: true if that is what you mean",
                  what));
}

void check_data_tokenizers(const Config& cfg) {
  if (cfg.data.synthetic) return;
  std::optional<std::pair<std::string, std::string>> first;  // (key, sidecar) of the first dataset with a sidecar
  each_dataset(cfg, [&](const std::string& key, const std::string& prefix) {
    const std::string sidecar = tokenizer_sidecar_path(prefix);
    std::error_code ec;
    if (!std::filesystem::exists(sidecar, ec)) return;
    if (!first)
      first.emplace(key, sidecar);
    else
      check_same_tokenizer(first->first, first->second, key, sidecar, cfg);
  });
}

namespace {

// data.sft_packing: pad cuts one document (sequence) per sample.
GptDataset::Cut cut_of(const Config& cfg) {
  return cfg.data.sft_packing == SftPacking::pad ? GptDataset::Cut::sequences : GptDataset::Cut::stream;
}

// One split of a data list: its sample source, samples per epoch (for a blend: the blend's size) and a
// description for the log.
struct SplitSource {
  SampleFn fn;
  SampleFn positions;  // data.sft_packing: pack: each token's position within its document
  int64_t samples = 0;
  std::string description;
};

// A plain list of prefixes: the chosen split range of every dataset concatenated into one stream.
// `pick` gives the (begin, end) sequence range of a dataset.
// `limit` bounds the values read (model.vocab_size for tokens, 2 for a loss mask).
template <typename Pick>
SplitSource concatenated(const std::vector<std::string>& prefixes, Pick&& pick, const Config& cfg, const char* key,
                         int64_t limit) {
  const int64_t S = cfg.model.seq_length;
  std::vector<TokenStream::Part> parts;
  for (const std::string& prefix : prefixes) {
    auto d = std::make_shared<const IndexedDataset>(prefix);
    const auto [begin, end] = pick(*d);
    parts.push_back({d, begin, end, TokenStream::Unit::sequences});
  }
  auto stream = std::make_shared<const TokenStream>(parts);
  SplitSource out;
  if (cut_of(cfg) == GptDataset::Cut::stream ? stream->num_tokens() < S + 1 : stream->num_sequences() == 0) {
    out.description = fmt::format("{} tokens", stream->num_tokens());
    return out;
  }
  auto dataset = std::make_shared<GptDataset>(stream, S, static_cast<uint64_t>(cfg.training.seed), true, cut_of(cfg));
  out.fn = checked(dataset, limit, key);
  if (cfg.data.sft_packing == SftPacking::pack)
    out.positions = [dataset](int64_t g, std::span<int32_t> o) { dataset->sample_positions(g, o); };
  out.samples = dataset->samples_per_epoch();
  out.description = fmt::format("{} samples per epoch ({} tokens)", out.samples, stream->num_tokens());
  return out;
}

// A weighted blend (megatron-core's BlendedDataset): each dataset's split range is its own seeded dataset,
// and global sample g reads sample k of dataset d, (d, k) from the blending rule over the weights. `target`
// samples are planned (the run's need); the blend's size is the sum of ceil(target * w_i). Samples past it
// continue the same rule, so a longer run never fails for want of blend indices.
template <typename Pick>
SplitSource blended(const DataBlend& blend, Pick&& pick, int64_t target, const Config& cfg, const char* key,
                    int64_t limit) {
  const int64_t S = cfg.model.seq_length;
  const std::vector<double> weights = normalize_blend_weights(blend.weights);
  const std::vector<int64_t> sizes = blend_sizes(weights, target);
  // blended_dataset.py normalizes the (already normalized) weights once more; keep its last bits.
  auto index = std::make_shared<const BlendIndex>(normalize_blend_weights(weights));
  std::vector<std::shared_ptr<const GptDataset>> datasets;
  std::vector<std::string> shares;
  int64_t size = 0;
  for (int64_t n : sizes) size += n;
  const std::vector<int64_t> counts = index->counts(size);
  for (size_t i = 0; i < blend.prefixes.size(); ++i) {
    auto d = std::make_shared<const IndexedDataset>(blend.prefixes[i]);
    const auto [begin, end] = pick(*d);
    auto stream = std::make_shared<const TokenStream>(
        std::vector<TokenStream::Part>{{d, begin, end, TokenStream::Unit::sequences}});
    // Every dataset shuffles with the run's seed, as megatron-core's mid-level datasets share random_seed.
    auto dataset =
        std::make_shared<const GptDataset>(stream, S, static_cast<uint64_t>(cfg.training.seed), true, cut_of(cfg));
    if (dataset->samples_per_epoch() == 0)
      throw DataError(
          fmt::format("{}: {} (weight {}) holds {} tokens in this split, fewer than one sample of "
                      "model.seq_length+1={} tokens",
                      key, blend.prefixes[i], blend.weights[i], stream->num_tokens(), S + 1));
    shares.push_back(fmt::format("{} w={:.4g}: {} samples ({:.2f} epochs of {})", blend.prefixes[i], weights[i],
                                 counts[i], static_cast<double>(counts[i]) / dataset->samples_per_epoch(),
                                 dataset->samples_per_epoch()));
    datasets.push_back(std::move(dataset));
  }
  SplitSource out;
  out.fn = checked(
      [index, datasets](int64_t g, std::span<int32_t> o) {
        const auto [d, k] = index->at(g);
        datasets[static_cast<size_t>(d)]->sample(k, o);
      },
      limit, key,
      [index, datasets](int64_t g, int64_t i) {
        const auto [d, k] = index->at(g);
        return datasets[static_cast<size_t>(d)]->where(k, i);
      });
  if (cfg.data.sft_packing == SftPacking::pack)
    out.positions = [index, datasets](int64_t g, std::span<int32_t> o) {
      const auto [d, k] = index->at(g);
      datasets[static_cast<size_t>(d)]->sample_positions(k, o);
    };
  out.samples = size;
  out.description = fmt::format("blend of {} samples [{}]", size, fmt::join(shares, "; "));
  return out;
}

// The same datasets' loss masks (chat_template.h's PREFIX_mask).
DataBlend with_loss_masks(DataBlend blend) {
  for (std::string& prefix : blend.prefixes) prefix = loss_mask_prefix(prefix);
  return blend;
}

// Whether the list `key` trains on loss masks (data.loss_mask); every mask is checked against its tokens.
bool uses_loss_mask(const Config& cfg, const DataBlend& blend, const char* key) {
  if (cfg.data.loss_mask == LossMaskChoice::off) return false;
  std::vector<std::string> with, without;
  for (const std::string& prefix : blend.prefixes) {
    std::error_code ec;
    const std::string m = loss_mask_prefix(prefix);
    const bool has = std::filesystem::exists(m + ".bin", ec) && std::filesystem::exists(m + ".idx", ec);
    (has ? with : without).push_back(prefix);
  }
  if (with.empty() && cfg.data.loss_mask == LossMaskChoice::automatic) return false;
  if (!without.empty())
    throw DataError(
        fmt::format("{}: {} has no loss mask {}.bin/.idx ({}); `megatrain data prepare --format chat` writes one; set "
                    "data.loss_mask: false to train on every token",
                    key, without[0], loss_mask_prefix(without[0]),
                    with.empty() ? std::string("data.loss_mask is true") : fmt::format("but {} has one", with[0])));
  for (const std::string& prefix : with) {
    try {
      open_tokens_with_loss_mask(prefix);
    } catch (const DataError& e) {
      throw DataError(fmt::format("{}: {}", key, e.what()));
    }
  }
  return true;
}

}  // namespace

DataSources open_data_sources(const Config& cfg) {
  DataSources ds;
  const int64_t S = cfg.model.seq_length;
  const uint64_t seed = static_cast<uint64_t>(cfg.training.seed);
  if (cfg.data.synthetic) {
    if (cfg.data.sft_packing == SftPacking::pack)
      throw ConfigError(
          "data.sft_packing: pack resets positions and attention at document boundaries, and data.synthetic's "
          "random tokens have none; set data.sft_packing: concat or name data.train");
    auto train = std::make_shared<SyntheticDataset>(cfg.model.vocab_size, S, seed);
    auto valid = std::make_shared<SyntheticDataset>(cfg.model.vocab_size, S, seed + 1);
    ds.train = [train](int64_t g, std::span<int32_t> out) { train->sample(g, out); };
    ds.valid = [valid](int64_t g, std::span<int32_t> out) { valid->sample(g, out); };
    ds.description = fmt::format("synthetic tokens in [0, {})", cfg.model.vocab_size);
    return ds;
  }

  // megatron-core splits GPT data by sequences: split i of a dataset is split_ranges(its sequences)[i].
  auto split_part = [&](int i) {
    return [&cfg, i](const IndexedDataset& d) { return split_ranges(d.num_sequences(), cfg.data.split)[i]; };
  };
  auto whole = [](const IndexedDataset& d) { return std::pair<int64_t, int64_t>{0, d.num_sequences()}; };
  // The samples a run reads: train_iters global batches, and the first eval_iters of validation (the same
  // ones at every evaluation), as megatron-core's train / test sample counts.
  const int64_t G = cfg.training.global_batch_size;
  const int64_t train_target = cfg.training.train_iters * G, valid_target = cfg.logging.eval_iters * G;

  const DataBlend train_blend = parse_data_blend(cfg.data.train);
  const DataBlend valid_blend = parse_data_blend(cfg.data.valid);
  // The splits of the token datasets (limit model.vocab_size) or, as the same calls on the _mask prefixes, of
  // their loss masks (limit 2): the same sequence counts, seeds and blend, so the same samples.
  auto train_split = [&](const DataBlend& tb, int64_t limit) {
    return tb.weights.empty() ? concatenated(tb.prefixes, split_part(0), cfg, "data.train", limit)
                              : blended(tb, split_part(0), train_target, cfg, "data.train", limit);
  };
  auto valid_split = [&](const DataBlend& tb, const DataBlend& vb, int64_t limit) {
    if (!cfg.data.valid.empty())
      return vb.weights.empty() ? concatenated(vb.prefixes, whole, cfg, "data.valid", limit)
                                : blended(vb, whole, valid_target, cfg, "data.valid", limit);
    if (tb.weights.empty()) return concatenated(tb.prefixes, split_part(1), cfg, "data.valid", limit);
    // The validation split of every dataset of the training blend, blended with the same weights; a dataset
    // whose validation split holds no sample leaves the run without validation.
    try {
      return blended(tb, split_part(1), valid_target, cfg, "data.valid", limit);
    } catch (const DataError& e) {
      return SplitSource{.samples = 0, .description = e.what()};
    }
  };
  const int64_t V = cfg.model.vocab_size;
  SplitSource train = train_split(train_blend, V);
  if (!train.fn)
    throw DataError(
        fmt::format("data.train: the training split holds {}, fewer than one sample of "
                    "model.seq_length+1={} tokens",
                    train.description, S + 1));
  SplitSource valid = valid_split(train_blend, valid_blend, V);
  const bool train_masked = uses_loss_mask(cfg, train_blend, "data.train");
  const bool valid_masked = cfg.data.valid.empty() ? train_masked : uses_loss_mask(cfg, valid_blend, "data.valid");
  if (cfg.data.sft_packing == SftPacking::pad && (!train_masked || (valid.fn && !valid_masked)))
    throw ConfigError(
        fmt::format("data.sft_packing: pad needs loss masks (PREFIX_mask, from `data prepare --format chat`) so the "
                    "padding does not count, but {} has none{}",
                    train_masked ? "data.valid" : "data.train",
                    cfg.data.loss_mask == LossMaskChoice::off ? " (data.loss_mask is false)" : ""));
  if (train_masked) ds.train_mask = train_split(with_loss_masks(train_blend), 2).fn;
  if (valid.fn && valid_masked)
    ds.valid_mask = valid_split(with_loss_masks(train_blend), with_loss_masks(valid_blend), 2).fn;
  ds.train = train.fn;
  ds.train_positions = train.positions;
  ds.valid_positions = valid.positions;
  ds.train_samples = train.samples;
  ds.valid = valid.fn;
  ds.valid_samples = valid.fn ? valid.samples : 0;
  ds.description = fmt::format("train: {}; validation: {}{}{}", train.description,
                               valid.fn ? valid.description : fmt::format("none ({})", valid.description),
                               train_masked ? "; loss only where the loss masks (PREFIX_mask) hold 1" : "",
                               cfg.data.sft_packing == SftPacking::pack
                                   ? "; positions and attention reset at document boundaries (data.sft_packing: pack)"
                                   : "");
  return ds;
}

SampleFn file_order_source(const std::vector<std::string>& prefixes, int64_t seq_length, int64_t vocab_size,
                           int64_t& count, bool verify_checksums) {
  std::vector<TokenStream::Part> parts;
  for (const std::string& prefix : prefixes) {
    if (verify_checksums) verify_checksums_at(fmt::format("--data {}", prefix), prefix, "--skip-checksums");
    auto d = std::make_shared<const IndexedDataset>(prefix);
    parts.push_back({d, 0, d->num_documents()});
  }
  auto dataset = std::make_shared<GptDataset>(std::make_shared<const TokenStream>(parts), seq_length, 0, false);
  count = dataset->samples_per_epoch();
  return checked(dataset, vocab_size, "--data");
}

void make_positions(const SampleFn& positions, int64_t first, int64_t batch, int64_t seq_length, Tensor& out) {
  std::vector<int32_t> buf(static_cast<size_t>(seq_length + 1));
  int32_t* pos = out.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    positions(first + b, buf);
    std::copy(buf.begin(), buf.end() - 1, pos + b * seq_length);
  }
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

namespace mt::app {

int64_t make_loss_weights(const SampleFn& mask, int64_t first, int64_t batch, int64_t seq_length, float weight,
                          Tensor& weights) {
  std::vector<int32_t> buf(static_cast<size_t>(seq_length + 1));
  float* w = weights.data<float>();  // (B * S)
  int64_t counted = 0;
  for (int64_t b = 0; b < batch; ++b) {
    mask(first + b, buf);
    for (int64_t j = 0; j < seq_length; ++j) {
      const bool counts = buf[static_cast<size_t>(j + 1)] != 0;  // target j is token j + 1
      w[b * seq_length + j] = counts ? weight : 0.f;
      counted += counts;
    }
  }
  return counted;
}

int64_t count_loss_targets(const SampleFn& mask, int64_t first, int64_t count, int64_t seq_length) {
  std::vector<int32_t> buf(static_cast<size_t>(seq_length + 1));
  int64_t counted = 0;
  for (int64_t g = first; g < first + count; ++g) {
    mask(g, buf);
    for (int64_t j = 1; j <= seq_length; ++j) counted += buf[static_cast<size_t>(j)] != 0;
  }
  return counted;
}

}  // namespace mt::app
