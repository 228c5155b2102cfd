#include "app/train/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/io/file_error.h"

namespace mt::app {

namespace {

// The float's shortest decimal form as a double (so 6e-4 is written 0.0006, not 0.0006000000284984708).
double shortest(float v) { return std::stod(fmt::format("{}", v)); }
double rounded(double v, double scale) { return std::isfinite(v) ? std::round(v * scale) / scale : v; }

}  // namespace

MetricsFile::MetricsFile(const std::string& run_dir, bool tensorboard, SinkErrorAction on_error) : on_error_(on_error) {
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
  errno = 0;
  out_ << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  out_.flush();
  if (out_) return;
  const int os_error = errno;
  out_.close();
  close_failed(fmt::format("{}: cannot write: {}", path_, os_error != 0 ? std::strerror(os_error) : "unknown error"));
}

void MetricsFile::tensorboard(const std::function<void(TensorBoardWriter&)>& points) {
  if (!tensorboard_) return;
  try {
    points(*tensorboard_);
  } catch (const FileError& e) {
    tensorboard_.reset();
    close_failed(e.what());
  }
}

void MetricsFile::close_failed(const std::string& error) {
  failed_ = true;
  spdlog::warn("logging sink failed: {}; it is closed and {} (logging.on_sink_error={})", error,
               on_error_ == SinkErrorAction::warn ? "training goes on without it"
                                                  : "the run saves a checkpoint and stops after this iteration",
               name_of(on_error_));
}

namespace {

// f(name, peak bytes) for each device memory kind of `device`'s pool, in MemKind order: the log's peak memory line,
// metrics.jsonl's peak_bytes_by_kind and TensorBoard's memory/peak-KIND-MiB.
template <class F>
void for_each_device_peak(Device device, F&& f) {
  const MemoryStats& m = allocator_for(device).stats();
  for (size_t k = 0; k < MemoryStats::kKinds; ++k)
    if (const auto kind = static_cast<MemKind>(k); is_device_kind(kind)) f(mem_kind_name(kind), m.peak[k]);
}

}  // namespace

std::string memory_summary(Device device) {
  std::string s;
  for_each_device_peak(
      device, [&](std::string_view kind, int64_t peak) { s += fmt::format("{} {:.2f} | ", kind, peak / 1048576.0); });
  s += fmt::format("total {:.2f}", allocator_for(device).stats().peak_total / 1048576.0);
  // The host pool (optimizer.offload), apart from the device's total; the CPU allocator's on every backend.
  if (const int64_t host = host_peak_bytes(); host > 0) s += fmt::format(" | host {:.2f}", host / 1048576.0);
  return s;
}

int64_t host_peak_bytes() { return allocator_for(Device::cpu).stats().host_peak; }

double eta_seconds(int64_t iteration, int64_t train_iters, double seconds_per_iter) {
  return static_cast<double>(std::max<int64_t>(train_iters - iteration, 0)) * std::max(seconds_per_iter, 0.0);
}

namespace {

// The grad norm of the interval's last step; an inf/NaN step was skipped, which says more than "-nan".
std::string grad_norm_text(const IntervalReport& r) {
  if (r.last_overflow || !std::isfinite(r.grad_norm))
    return r.fp16 ? "overflow (step skipped)" : "not finite (step skipped)";
  return fmt::format("{:.4f}", r.grad_norm);
}

// The MoE part of a line: " | moe aux 1.012 z 3.21 | load max/mean 1.18 cv 0.07" (the worst layer's); empty for
// a dense model.
std::string moe_text(const MoeIntervalReport& m) {
  if (!m.enabled || m.layers.empty()) return "";
  std::string s = " | moe";
  if (m.has_aux) s += fmt::format(" aux {:.4f}", m.aux_loss);
  if (m.has_z) s += fmt::format(" z {:.4f}", m.z_loss);
  double worst = 0, cv = 0;
  for (const MoeLayerLoad& l : m.layers) {
    if (l.mean > 0) worst = std::max(worst, static_cast<double>(l.max) / l.mean);
    cv = std::max(cv, l.cv);
  }
  s += fmt::format(" load max/mean {:.2f} cv {:.3f}", worst, cv);
  if (m.dropped_tokens > 0) s += fmt::format(" dropped {}", m.dropped_tokens);
  return s;
}

std::string verbose_line(const IntervalReport& r) {
  const std::string mfu_text = r.peak_tflops > 0 ? fmt::format("{:5.1f}%", 100.0 * r.tflops_per_gpu / r.peak_tflops)
                                                 : fmt::format("n/a ({})", device_name(r.device));
  return fmt::format(
             " iteration {:>7}/{:<7} | consumed samples {:>9} | ms/iter {:8.1f} | tokens/s {:9.0f} | "
             "TFLOP/s/GPU {:7.3f} | MFU {} | lr {:.3e} | loss {:.6e} | loss scale {} | grad norm {} | "
             "skipped {} | nan {} | elapsed {} | ETA {}",
             r.iteration, r.train_iters, r.consumed_samples, r.ms_per_iter, r.tokens_per_s, r.tflops_per_gpu, mfu_text,
             r.lr, r.loss, r.loss_scale, grad_norm_text(r), r.skipped_iters, r.nan_iters, format_duration(r.elapsed_s),
             format_duration(r.eta_s)) +
         moe_text(r.moe);
}

// About 120 characters: what a person watching a run looks at; the rest only when it says something.
std::string short_line(const IntervalReport& r) {
  std::string s = fmt::format(
      " iter {}/{} | {} ETA {} | loss {:.4f} | lr {:.2e} | grad norm {}", r.iteration, r.train_iters,
      format_duration(r.elapsed_s), format_duration(r.eta_s), r.loss, r.lr,
      r.last_overflow || !std::isfinite(r.grad_norm) ? grad_norm_text(r) : fmt::format("{:.3f}", r.grad_norm));
  if (r.fp16) s += fmt::format(" | loss scale {}", r.loss_scale);
  s += fmt::format(" | {:.0f} tokens/s", r.tokens_per_s);
  // Three significant digits: a CPU run's 0.0012 as well as a GPU's 412.
  s += fmt::format(" | {} TFLOP/s/GPU", r.tflops_per_gpu >= 100 ? fmt::format("{:.0f}", r.tflops_per_gpu)
                                                                : fmt::format("{:.3g}", r.tflops_per_gpu));
  if (r.peak_tflops > 0) s += fmt::format(", MFU {:.1f}%", 100.0 * r.tflops_per_gpu / r.peak_tflops);
  if (r.skipped_iters > 0) s += fmt::format(" | skipped {}", r.skipped_iters);
  if (r.nan_iters > 0) s += fmt::format(" | nan {}", r.nan_iters);
  s += moe_text(r.moe);
  if (!r.comm_bytes.empty()) s += fmt::format(" | comm {:.3g} MB/step", comm_bytes_total(r.comm_bytes) / 1e6);
  return s;
}

}  // namespace

double comm_bytes_total(const std::map<std::string, std::map<std::string, double>>& by_group) {
  double total = 0;
  for (const auto& [group, ops] : by_group)
    for (const auto& [op, bytes] : ops)
      if (op != "scalars") total += bytes;
  return total;
}

std::string interval_line(const IntervalReport& r) { return r.verbose_line ? verbose_line(r) : short_line(r); }

std::string attention_calls_summary(const AttentionCalls& c) {
  std::vector<std::string> parts;
  if (c.cudnn != 0) parts.push_back(fmt::format("cuDNN fused {}", c.cudnn));
  if (c.kernel != 0) parts.push_back(fmt::format("megatrain kernel {}", c.kernel));
  if (c.cpu != 0) parts.push_back(fmt::format("CPU {}", c.cpu));
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

void report_interval(const IntervalReport& r, MetricsFile& metrics) {
  spdlog::info("{}", interval_line(r));
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
  nlohmann::ordered_json kinds;
  for_each_device_peak(r.device, [&](std::string_view kind, int64_t peak) { kinds[std::string(kind)] = peak; });
  j["peak_bytes_by_kind"] = kinds;
  if (r.host_peak_bytes > 0) j["host_peak_bytes"] = r.host_peak_bytes;  // the host pool (optimizer.offload)
  if (!r.peak_bytes_per_rank.empty()) j["peak_bytes_per_rank"] = r.peak_bytes_per_rank;
  if (!r.peak_activation_bytes_per_rank.empty()) j["peak_activation_bytes_per_rank"] = r.peak_activation_bytes_per_rank;
  if (r.moe_peak_received > 0) j["moe_peak_received"] = r.moe_peak_received;
  j["device"] = std::string(device_name(r.device));
  j["elapsed_s"] = rounded(r.elapsed_s, 1e3);
  j["eta_s"] = rounded(r.eta_s, 1e3);
  j["attention_cudnn_calls"] = r.attention.cudnn;
  j["attention_kernel_calls"] = r.attention.kernel;
  j["attention_cpu_calls"] = r.attention.cpu;
  if (!r.comm_bytes.empty()) {
    j["comm_bytes"] = comm_bytes_total(r.comm_bytes);
    j["comm_bytes_by_group"] = r.comm_bytes;
  }
  if (r.straggler)
    j["busy_ms"] = {{"stage_median", rounded(r.straggler->median_ms, 1e3)},
                    {"slowest", rounded(r.straggler->busy_ms, 1e3)},
                    {"slowest_rank", r.straggler->slowest_rank},
                    {"straggler", r.straggler->warn}};
  if (r.moe.enabled) {
    if (r.moe.has_aux) j["moe_aux_loss"] = r.moe.aux_loss;
    if (r.moe.has_z) j["moe_z_loss"] = r.moe.z_loss;
    j["moe_dropped_tokens"] = r.moe.dropped_tokens;
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const MoeLayerLoad& l : r.moe.layers)
      layers.push_back({{"layer", l.layer}, {"min", l.min}, {"max", l.max}, {"mean", l.mean}, {"cv", l.cv}});
    j["moe_load"] = layers;
  }
  metrics.write(j);
  metrics.tensorboard([&](TensorBoardWriter& tb) {
    // Megatron's tags where it has them; the loss also against samples and tokens (curves of runs with other
    // batch sizes line up).
    const int64_t it = r.iteration;
    const auto value = [](double v) { return static_cast<float>(v); };
    tb.scalar("lm loss", it, value(r.loss));
    tb.scalar("lm loss vs samples", r.consumed_samples, value(r.loss));
    tb.scalar("lm loss vs tokens", r.consumed_tokens, value(r.loss));
    tb.scalar("learning-rate", it, r.lr);
    tb.scalar("grad-norm", it, value(r.grad_norm));
    tb.scalar("loss-scale", it, value(r.loss_scale));
    tb.scalar("skipped-iterations", it, value(static_cast<double>(r.skipped_iters)));
    tb.scalar("nan-iterations", it, value(static_cast<double>(r.nan_iters)));
    tb.scalar("consumed-samples", it, value(static_cast<double>(r.consumed_samples)));
    tb.scalar("tokens-per-second", it, value(r.tokens_per_s));
    tb.scalar("iteration-time-ms", it, value(r.ms_per_iter));
    tb.scalar("tflops-per-gpu", it, value(r.tflops_per_gpu));
    if (r.peak_tflops > 0) tb.scalar("mfu", it, value(r.tflops_per_gpu / r.peak_tflops));
    for_each_device_peak(r.device, [&](std::string_view kind, int64_t peak) {
      tb.scalar(fmt::format("memory/peak-{}-MiB", kind), it, value(peak / 1048576.0));
    });
    tb.scalar("memory/peak-total-MiB", it, value(allocator_for(r.device).stats().peak_total / 1048576.0));
    if (r.host_peak_bytes > 0) tb.scalar("memory/peak-host-MiB", it, value(r.host_peak_bytes / 1048576.0));
    if (r.moe.enabled) {
      if (r.moe.has_aux) tb.scalar("moe/load-balancing-loss", it, value(r.moe.aux_loss));
      if (r.moe.has_z) tb.scalar("moe/z-loss", it, value(r.moe.z_loss));
      tb.scalar("moe/dropped-tokens", it, value(static_cast<double>(r.moe.dropped_tokens)));
      for (const MoeLayerLoad& l : r.moe.layers) {
        tb.scalar(fmt::format("moe/layer-{}-load-cv", l.layer), it, value(l.cv));
        if (l.mean > 0)
          tb.scalar(fmt::format("moe/layer-{}-load-max-over-mean", l.layer), it,
                    value(static_cast<double>(l.max) / l.mean));
      }
    }
    tb.flush();
  });
}

void report_validation(int64_t iteration, int64_t consumed_samples, int64_t consumed_tokens, double loss,
                       MetricsFile& metrics) {
  spdlog::info(" validation loss at iteration {}: {:.6e} | perplexity {:.3f}", iteration, loss, std::exp(loss));
  metrics.write({{"iteration", iteration},
                 {"consumed_samples", consumed_samples},
                 {"consumed_tokens", consumed_tokens},
                 {"valid_loss", loss}});
  metrics.tensorboard([&](TensorBoardWriter& tb) {
    tb.scalar("lm loss validation", iteration, static_cast<float>(loss));
    tb.scalar("lm loss validation ppl", iteration, static_cast<float>(std::exp(loss)));
    tb.scalar("lm loss validation vs samples", consumed_samples, static_cast<float>(loss));
    tb.flush();
  });
}

}  // namespace mt::app
