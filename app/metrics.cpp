#include "app/metrics.h"

#include <cmath>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace mt::app {

namespace {

// The float's shortest decimal form as a double (so 6e-4 is written 0.0006, not 0.0006000000284984708).
double shortest(float v) { return std::stod(fmt::format("{}", v)); }
double rounded(double v, double scale) { return std::isfinite(v) ? std::round(v * scale) / scale : v; }

}  // namespace

MetricsFile::MetricsFile(const std::string& run_dir, bool tensorboard) {
  if (run_dir.empty()) return;
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  out_.open(path_, std::ios::app);
  if (!out_) throw std::runtime_error(fmt::format("{}: cannot open for writing", path_));
  if (tensorboard)
    tensorboard_ = std::make_unique<TensorBoardWriter>((std::filesystem::path(run_dir) / "tensorboard").string());
}

void MetricsFile::write(const nlohmann::ordered_json& record) {
  if (!out_.is_open()) return;
  // Invalid UTF-8 in a string (a path) is replaced rather than thrown: a log line must never stop training.
  out_ << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error(fmt::format("{}: write failed", path_));
}

std::string memory_summary(Device device) {
  const MemoryStats& m = allocator_for(device).stats();
  std::string s;
  for (size_t k = 0; k < MemoryStats::kKinds; ++k)
    s += fmt::format("{} {:.2f} | ", mem_kind_name(static_cast<MemKind>(k)), m.peak[k] / 1048576.0);
  return s + fmt::format("total {:.2f}", m.peak_total / 1048576.0);
}

void report_interval(const IntervalReport& r, MetricsFile& metrics) {
  const std::string mfu_text = r.peak_tflops > 0 ? fmt::format("{:5.1f}%", 100.0 * r.tflops_per_gpu / r.peak_tflops)
                                                 : fmt::format("n/a ({})", device_name(r.device));
  spdlog::info(
      " iteration {:>7}/{:<7} | consumed samples {:>9} | ms/iter {:8.1f} | tokens/s {:9.0f} | "
      "TFLOP/s/GPU {:7.3f} | MFU {} | lr {:.3e} | loss {:.6e} | loss scale {} | grad norm {:.4f} | "
      "skipped {} | nan {}",
      r.iteration, r.train_iters, r.consumed_samples, r.ms_per_iter, r.tokens_per_s, r.tflops_per_gpu, mfu_text, r.lr,
      r.loss, r.loss_scale, r.grad_norm, r.skipped_iters, r.nan_iters);
  nlohmann::ordered_json j;
  j["iteration"] = r.iteration;
  j["consumed_samples"] = r.consumed_samples;
  j["consumed_tokens"] = r.consumed_tokens;
  j["ms_per_iter"] = rounded(r.ms_per_iter, 1e3);
  j["tokens_per_s"] = rounded(r.tokens_per_s, 1e1);
  j["tflops"] = rounded(r.tflops_per_gpu, 1e6);
  j["mfu"] = r.peak_tflops > 0 ? nlohmann::ordered_json(r.tflops_per_gpu / r.peak_tflops) : nullptr;
  j["lr"] = shortest(r.lr);
  j["loss"] = r.loss;  // non-finite values are written as null
  j["loss_scale"] = r.loss_scale;
  j["grad_norm"] = r.grad_norm;
  j["skipped_iters"] = r.skipped_iters;
  j["nan_iters"] = r.nan_iters;
  j["peak_bytes"] = r.peak_bytes;
  j["device"] = std::string(device_name(r.device));
  metrics.write(j);
  if (TensorBoardWriter* tb = metrics.tensorboard()) {
    // Megatron's tags where it has them; the loss also against samples and tokens (curves of runs with other
    // batch sizes line up).
    const int64_t it = r.iteration;
    const auto value = [](double v) { return static_cast<float>(v); };
    tb->scalar("lm loss", it, value(r.loss));
    tb->scalar("lm loss vs samples", r.consumed_samples, value(r.loss));
    tb->scalar("lm loss vs tokens", r.consumed_tokens, value(r.loss));
    tb->scalar("learning-rate", it, r.lr);
    tb->scalar("grad-norm", it, value(r.grad_norm));
    tb->scalar("loss-scale", it, value(r.loss_scale));
    tb->scalar("skipped-iterations", it, value(static_cast<double>(r.skipped_iters)));
    tb->scalar("nan-iterations", it, value(static_cast<double>(r.nan_iters)));
    tb->scalar("consumed-samples", it, value(static_cast<double>(r.consumed_samples)));
    tb->scalar("tokens-per-second", it, value(r.tokens_per_s));
    tb->scalar("iteration-time-ms", it, value(r.ms_per_iter));
    tb->scalar("tflops-per-gpu", it, value(r.tflops_per_gpu));
    if (r.peak_tflops > 0) tb->scalar("mfu", it, value(r.tflops_per_gpu / r.peak_tflops));
    const MemoryStats& m = allocator_for(r.device).stats();
    for (size_t k = 0; k < MemoryStats::kKinds; ++k)
      tb->scalar(fmt::format("memory/peak-{}-MiB", mem_kind_name(static_cast<MemKind>(k))), it,
                 value(m.peak[k] / 1048576.0));
    tb->scalar("memory/peak-total-MiB", it, value(m.peak_total / 1048576.0));
    tb->flush();
  }
}

void report_validation(int64_t iteration, int64_t consumed_samples, int64_t consumed_tokens, double loss,
                       MetricsFile& metrics) {
  spdlog::info(" validation loss at iteration {}: {:.6e} | perplexity {:.3f}", iteration, loss, std::exp(loss));
  metrics.write({{"iteration", iteration},
                 {"consumed_samples", consumed_samples},
                 {"consumed_tokens", consumed_tokens},
                 {"valid_loss", loss}});
  if (TensorBoardWriter* tb = metrics.tensorboard()) {
    tb->scalar("lm loss validation", iteration, static_cast<float>(loss));
    tb->scalar("lm loss validation ppl", iteration, static_cast<float>(std::exp(loss)));
    tb->scalar("lm loss validation vs samples", consumed_samples, static_cast<float>(loss));
    tb->flush();
  }
}

}  // namespace mt::app
