// metrics.h: what a training run reports. RUN_DIR/metrics.jsonl gets one JSON object per line, written by a
// JSON library (strings escaped, inf and NaN as null); the console gets one line per logging interval.
#pragma once
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/train/straggler.h"
#include "core/tensor/allocator.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "core/config/config.h"
#include "core/io/progress.h"
#include "core/io/tensorboard.h"

namespace mt::app {

// Appends records to RUN_DIR/metrics.jsonl, flushed each time, and with `tensorboard` keeps TensorBoard event
// files under RUN_DIR/tensorboard; with an empty run_dir (ranks other than the logging one) it writes nothing.
// A sink that cannot be opened is an error; one whose write fails later (a full disk) is closed with a warning
// naming its file and the OS error, and training goes on without it (issue 30: a log line must never cost the
// iterations since the last checkpoint), or with SinkErrorAction::save_and_stop stop_asked() tells the trainer
// to save and stop.
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& run_dir, bool tensorboard = false,
                       SinkErrorAction on_error = SinkErrorAction::warn);
  void write(const nlohmann::ordered_json& record);
  // Runs `points` (scalars, then a flush) on the TensorBoard writer when it is open.
  void tensorboard(const std::function<void(TensorBoardWriter&)>& points);
  bool stop_asked() const { return failed_ && on_error_ == SinkErrorAction::save_and_stop; }

 private:
  void close_failed(const std::string& error);

  std::string path_;
  std::ofstream out_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  SinkErrorAction on_error_;
  bool failed_ = false;  // a sink failed during the run and was closed
};

// "parameter 1.00 | gradient 1.00 | ... | total 4.00": the device's peak bytes per kind, in MiB, and " | host 9.00"
// after the total when the host pool (MemKind::host: optimizer.offload) was used.
std::string memory_summary(Device device);
// The host pool's peak bytes (MemKind::host, the CPU allocator's on every backend).
int64_t host_peak_bytes();

// One MoE layer's tokens per expert over a logging interval (every microbatch of every data-parallel rank).
struct MoeLayerLoad {
  int64_t layer = 0;  // the layer's global index
  int64_t min = 0, max = 0;
  double mean = 0;
  double cv = 0;  // coefficient of variation: standard deviation over mean (0: perfectly even)
};
// The mixture-of-experts figures of a logging interval (model.moe; enabled false for a dense model).
struct MoeIntervalReport {
  bool enabled = false;
  bool has_aux = false, has_z = false;  // the losses are configured (their coefficients > 0)
  double aux_loss = 0;                  // mean over MoE layers and microbatches, without the coefficient (1: even)
  double z_loss = 0;                    // the same for the router z-loss
  int64_t dropped_tokens = 0;           // choices dropped for capacity (0: dropless)
  std::vector<MoeLayerLoad> layers;
};

// The figures of one logging interval (means over its iterations where they vary).
struct IntervalReport {
  int64_t iteration = 0, train_iters = 0;
  int64_t consumed_samples = 0, consumed_tokens = 0;
  double ms_per_iter = 0, tokens_per_s = 0;
  double tflops_per_gpu = 0;  // model FLOP/s per rank
  double peak_tflops = 0;     // the device's dense bf16 peak; 0 when unknown (no MFU)
  float lr = 0;
  double loss = 0, loss_scale = 1, grad_norm = 0;
  int64_t skipped_iters = 0, nan_iters = 0;
  int64_t peak_bytes = 0;       // the device pools'
  int64_t host_peak_bytes = 0;  // the host pool's (optimizer.offload); 0: not used
  Device device = Device::cpu;
  double elapsed_s = 0;                      // wall-clock seconds since this run started training
  double eta_s = 0;                          // the remaining iterations at the wall-clock pace of this interval
  bool fp16 = false;                         // a loss scale is in use (the short line shows it)
  bool last_overflow = false;                // the interval's last step had inf/NaN gradients (grad_norm is not finite)
  bool verbose_line = false;                 // logging.verbose_line: Megatron's long line
  std::vector<int64_t> peak_bytes_per_rank;  // by global rank, on the reports that gathered them; else empty
  // The same reports' activation peaks alone (what the pipeline schedule decides).
  std::vector<int64_t> peak_activation_bytes_per_rank;
  // Expert parallelism, on the reports that gathered the peaks: the most rows any rank's experts received in one
  // forward so far over their balanced share (MoeMlp::peak_received); 0: not gathered, or no EP.
  double moe_peak_received = 0;
  AttentionCalls attention;  // this rank's attention calls by implementation since the start
  MoeIntervalReport moe;
  // Bytes this rank's collectives moved per step over the interval, by group kind ("dp", "tp", ...) and op
  // (parallel/comm/comm_counted.h); empty on one rank.
  std::map<std::string, std::map<std::string, double>> comm_bytes;
  // The ranks' busy times compared within their stages (app/train/straggler.h); none on one rank.
  std::optional<StragglerVerdict> straggler;
};
// The bytes per step of a report's comm_bytes over every group and op but the scalar sums ("scalars").
double comm_bytes_total(const std::map<std::string, std::map<std::string, double>>& by_group);
// "cuDNN fused 96, megatrain kernel 0": the attention calls of an interval by the implementation that ran them
// (only the kinds that ran, or "none").
std::string attention_calls_summary(const AttentionCalls& calls);
// The seconds left for train_iters - iteration iterations at `seconds_per_iter`.
double eta_seconds(int64_t iteration, int64_t train_iters, double seconds_per_iter);
using mt::format_duration;  // core/io/progress.h: the interval line's durations are those of the progress lines
// The console line of an interval (without the logger's prefix): short, or long with r.verbose_line.
std::string interval_line(const IntervalReport& r);
// Logs the interval's line and writes its record.
void report_interval(const IntervalReport& r, MetricsFile& metrics);
// Logs a validation loss (and its perplexity) and writes its record; consumed_samples and consumed_tokens
// place it on the training curve.
void report_validation(int64_t iteration, int64_t consumed_samples, int64_t consumed_tokens, double loss,
                       MetricsFile& metrics);

}  // namespace mt::app
