// cmd_generate.cpp: `megatrain generate`: loads a checkpoint of any layout into one whole model, encodes a
// prompt with the checkpoint's tokenizer (its tokenizer.yaml; the byte tokenizer when it has none and the
// vocabulary is the byte tokenizer's 257) and continues it with a KV cache (models/generate.h): greedy, or
// sampled with temperature, top-k and top-p from a seed. Prints the new text (or ids) on stdout, a summary on
// stderr.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/train/checkpointing.h"
#include "app/cli/commands.h"
#include "app/cli/option_checks.h"
#include "app/runtime/device.h"
#include "core/checkpoint/checkpoint.h"
#include "core/io/file_io.h"
#include "core/hf/hf_tokenizer_export.h"
#include "core/config/config.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/tokenizer_sidecar.h"
#include "models/generate.h"
#include "models/gpt.h"

namespace mt::app {

namespace {

struct GenerateArgs {
  std::string checkpoint;
  std::string prompt, prompt_file;
  int64_t max_new_tokens = 64;
  float temperature = 1.f;
  int64_t top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 1234;
  bool greedy = false;
  bool ids = false;
  std::string precision = "fp32";
  std::string device = "auto";
};

// The tokenizer that made the checkpoint's training data, or the byte tokenizer when the checkpoint records
// none and its vocabulary is the byte tokenizer's.
std::unique_ptr<Tokenizer> checkpoint_tokenizer(const std::string& dir, const ModelConfig& model) {
  const std::string path = io::join_path(dir, kCheckpointTokenizerFile);
  if (std::optional<TokenizerSidecar> s = read_tokenizer_sidecar_file(path)) {
    std::unique_ptr<Tokenizer> tok = make_tokenizer(s->tokenizer);
    if (tok->vocab_size() > model.vocab_size)
      throw CheckpointError(fmt::format("{}: the tokenizer ({}) has {} ids but the model's vocab_size is {}", path,
                                        name_of(tok->kind()), tok->vocab_size(), model.vocab_size));
    return tok;
  }
  auto bytes = std::make_unique<ByteTokenizer>();
  if (model.vocab_size != bytes->vocab_size())
    throw CheckpointError(
        fmt::format("{}: no {} (its training data had no tokenizer sidecar) and model.vocab_size={} is not the "
                    "byte tokenizer's {}: cannot encode the prompt",
                    dir, kCheckpointTokenizerFile, model.vocab_size, bytes->vocab_size()));
  return bytes;
}

std::string read_prompt(const GenerateArgs& a) {
  if (a.prompt_file.empty()) return a.prompt;
  if (std::filesystem::is_directory(a.prompt_file))
    throw std::invalid_argument(fmt::format("--prompt-file {}: is a directory; give a text file", a.prompt_file));
  try {
    return io::read_text_file(a.prompt_file);
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("--prompt-file: {}", e.what()));
  }
}

const char* stop_name(StopReason r) {
  switch (r) {
    case StopReason::end_of_document:
      return "end of document";
    case StopReason::max_new_tokens:
      return "max new tokens";
    case StopReason::context_full:
      return "context full";
  }
  return "?";
}

void run_generate(const GenerateArgs& a) {
  // Everything the user gave is checked before the checkpoint is read.
  const GenerateOptions gen{.max_new_tokens = a.max_new_tokens,
                            .sampling = {.greedy = a.greedy || a.temperature == 0.f,
                                         .temperature = a.temperature,
                                         .top_k = a.top_k,
                                         .top_p = a.top_p,
                                         .seed = a.seed}};
  check_sampling_options(gen.sampling);
  const std::string text = read_prompt(a);
  if (text.empty())
    throw std::invalid_argument(a.prompt_file.empty() ? "--prompt: empty; generation needs some text to continue"
                                                      : fmt::format("--prompt-file {}: empty", a.prompt_file));

  const CheckpointReader reader = open_checkpoint(a.checkpoint);  // held while it is read: a live run keeps it
  // The saving run's model, whole, on one rank.
  Config cfg = whole_model_config(reader, reader.dir(), 1, a.device);
  const std::unique_ptr<Tokenizer> tok = checkpoint_tokenizer(reader.dir(), cfg.model);
  std::vector<int32_t> prompt;
  tok->encode(text, prompt);
  const int64_t P = cfg.model.max_position_embeddings;
  if (prompt.empty()) throw std::invalid_argument("the prompt encodes to no tokens");
  if (static_cast<int64_t>(prompt.size()) > P)
    throw std::invalid_argument(fmt::format("the prompt is {} tokens ({}), more than model.max_position_embeddings={}",
                                            prompt.size(), name_of(tok->kind()), P));

  const Placement placement = place_rank(cfg, LaunchEnv{});
  const std::unique_ptr<GptModel> saved = saved_model(reader, cfg, parse_dtype(a.precision), placement.device);
  GptModel& model = *saved;
  model.merge_lora();  // the KV-cache decoder computes with the linears' weights: W += scale B A
  KvCacheDecoder decoder(model, {.capacity = a.max_new_tokens >= P - static_cast<int64_t>(prompt.size())
                                                 ? P
                                                 : static_cast<int64_t>(prompt.size()) + a.max_new_tokens});
  GenerateOptions opt = gen;
  opt.stop_id = tok->eod();

  const auto start = std::chrono::steady_clock::now();
  const GenerateResult r = generate(decoder, prompt, opt);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (a.ids)
    fmt::print("{}\n", fmt::join(r.tokens, " "));
  else
    fmt::print("{}\n", tok->decode(r.tokens));
  fmt::print(stderr,
             "generated {} tokens after a prompt of {} ({}, {} on {}, iteration {}): stop: {}, {:.1f} tokens/s\n",
             r.tokens.size(), prompt.size(), name_of(tok->kind()), a.precision, device_name(placement.device),
             reader.state().iteration, stop_name(r.stop), static_cast<double>(r.tokens.size()) / seconds);
}

}  // namespace

void add_generate_command(CLI::App& root) {
  static GenerateArgs args;
  CLI::App* sub = root.add_subcommand("generate", "continue a prompt with a checkpoint (KV-cached sampling)");
  sub->add_option("--load", args.checkpoint, "checkpoint directory, or a save_dir with `latest`")->required();
  CLI::Option* prompt = sub->add_option("--prompt", args.prompt, "the text to continue");
  CLI::Option* file = sub->add_option("--prompt-file", args.prompt_file, "read the prompt from this file");
  prompt->excludes(file);
  sub->add_option("--max-new-tokens", args.max_new_tokens, "most tokens to generate")
      ->capture_default_str()
      ->check(at_least(1));
  CLI::Option* temperature =
      sub->add_option("--temperature", args.temperature, "divide the logits by T > 0 before sampling (0: greedy)")
          ->capture_default_str();
  CLI::Option* top_k =
      sub->add_option("--top-k", args.top_k, "sample among the K most likely tokens (0: off)")->capture_default_str();
  CLI::Option* top_p =
      sub->add_option("--top-p", args.top_p, "sample among the most likely tokens of total mass P (1: off)")
          ->capture_default_str();
  sub->add_option("--seed", args.seed, "seed of the sampling draws (same seed, same text)")->capture_default_str();
  sub->add_flag("--greedy", args.greedy, "always take the most likely token")
      ->excludes(temperature)
      ->excludes(top_k)
      ->excludes(top_p);
  sub->add_flag("--ids", args.ids, "print the generated token ids instead of their text");
  sub->add_option("--precision", args.precision, "fp32, bf16 or fp16")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  sub->add_option("--device", args.device, "auto (a GPU when there is one), cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  sub->callback([prompt, file] {
    if (prompt->count() == 0 && file->count() == 0)
      throw std::invalid_argument("generate: give the text to continue with --prompt TEXT or --prompt-file FILE");
    run_generate(args);
  });
}

}  // namespace mt::app
