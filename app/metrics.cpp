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

MetricsFile::MetricsFile(const std::string& run_dir) {
  if (run_dir.empty()) return;
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  out_.open(path_, std::ios::app);
  if (!out_) throw std::runtime_error(fmt::format("{}: cannot open for writing", path_));
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
}

void report_validation(int64_t iteration, double loss, MetricsFile& metrics) {
  spdlog::info(" validation loss at iteration {}: {:.6e} | perplexity {:.3f}", iteration, loss, std::exp(loss));
  metrics.write({{"iteration", iteration}, {"valid_loss", loss}});
}

}  // namespace mt::app
