// cmd_eval.cpp: `megatrain eval`: the mean loss of a checkpoint over the first K samples of a dataset in
// file order, so results can be compared with other tools.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/train/checkpointing.h"
#include "app/cli/commands.h"
#include "app/cli/option_checks.h"
#include "app/runtime/device.h"
#include "app/train/data_sources.h"
#include "core/checkpoint/checkpoint.h"
#include "core/config/config.h"
#include "models/gpt.h"

namespace mt::app {

namespace {

struct EvalArgs {
  std::string checkpoint;
  std::vector<std::string> data;
  int64_t samples = 0;
  int64_t micro_batch_size = 4;
  std::string precision = "fp32";
  std::string device = "auto";
  bool skip_checksums = false;
};

void run_eval(const EvalArgs& a) {
  const CheckpointReader reader = open_checkpoint(a.checkpoint);  // held while it is read: a live run keeps it
  // The saving run's model, on one rank.
  Config cfg = whole_model_config(reader, reader.dir(), a.micro_batch_size, a.device);
  const int64_t S = cfg.model.seq_length;
  const Placement placement = place_rank(cfg, LaunchEnv{});
  const std::unique_ptr<GptModel> saved = saved_model(reader, cfg, parse_dtype(a.precision), placement.device);
  GptModel& model = *saved;
  int64_t available = 0;
  SampleFn source = file_order_source(a.data, S, cfg.model.vocab_size, available, !a.skip_checksums);
  if (a.samples > available)
    throw std::invalid_argument(
        fmt::format("--samples {}: the data holds only {} samples of {} tokens", a.samples, available, S + 1));
  double sum = 0;  // sum of per-token losses
  for (int64_t first = 0; first < a.samples; first += a.micro_batch_size) {
    const int64_t B = std::min(a.micro_batch_size, a.samples - first);
    Tensor tokens = Tensor::empty({B, S}, DType::i32), targets = Tensor::empty({B, S}, DType::i32);
    make_batch(source, first, B, S, tokens, targets);
    if (placement.device != Device::cpu) {
      tokens = tokens.to(placement.device);
      targets = targets.to(placement.device);
    }
    sum += static_cast<double>(model.forward(tokens, targets, 0, StepContext{.training = false})) * B * S;
  }
  const double mean = sum / static_cast<double>(a.samples * S);
  if (!std::isfinite(mean))
    throw std::runtime_error(fmt::format(
        "eval: checkpoint {} (iteration {}): the mean loss over {} samples is {}, not finite: its weights hold inf "
        "or NaN (`megatrain ckpt inspect {} --verify` names them){}",
        reader.dir(), reader.state().iteration, a.samples, mean, reader.dir(),
        a.precision == "fp32" ? "" : fmt::format(", or {} overflows (try --precision fp32)", a.precision)));
  fmt::print("checkpoint {} (iteration {}), {} samples of {} tokens, {} on {}: mean loss {:.6f}, perplexity {:.4f}\n",
             reader.dir(), reader.state().iteration, a.samples, S, a.precision, device_name(placement.device), mean,
             std::exp(mean));
}

}  // namespace

void add_eval_command(CLI::App& root) {
  static EvalArgs args;
  CLI::App* sub = root.add_subcommand("eval", "mean loss of a checkpoint over the first K samples of a dataset");
  sub->add_option("--checkpoint", args.checkpoint, "checkpoint directory, or a save_dir with `latest`")->required();
  sub->add_option("--data", args.data, "indexed dataset prefix(es), read in file order")->required();
  sub->add_option("--samples", args.samples, "number of samples K")->required()->check(at_least(1));
  sub->add_option("--micro-batch-size", args.micro_batch_size, "samples per forward pass")->check(at_least(1));
  sub->add_option("--precision", args.precision, "fp32, bf16 or fp16")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  sub->add_option("--device", args.device, "auto (a GPU when there is one), cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  sub->add_flag("--skip-checksums", args.skip_checksums,
                "read the data without checking it against its PREFIX.crc32c (checked by default, as training does)");
  sub->callback([] { run_eval(args); });
}

}  // namespace mt::app
