// trainer_report.cpp: what the training loop says: the run's opening lines (data, model), the interval report
// (metrics.jsonl, TensorBoard, the log line), peak memory per rank and which attention implementation ran.
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "app/train/trainer_impl.h"
#include "parallel/comm/flight_recorder.h"
#include "core/io/file_io.h"
#include "core/tensor/trace.h"

namespace mt::app {

namespace {

// "124.4M", "8.03B": a parameter count as people say it.
std::string human_count(int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e9) return fmt::format("{:.2f}B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.1f}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f}K", x / 1e3);
  return fmt::format("{}", n);
}

// ", sliding window W" (with the full-attention layers' count when there are some), or "".
std::string sliding_window_note(const ModelConfig& m) {
  if (m.sliding_window == 0) return "";
  return m.full_attention_layers == 0
             ? fmt::format(", sliding window {}", m.sliding_window)
             : fmt::format(", sliding window {} past the first {} layers", m.sliding_window, m.full_attention_layers);
}
}  // namespace

void Trainer::log_run() {
  spdlog::info("data: {}", data_.description);
  const ModelConfig& m = cfg_.model;
  // The heads' width when it is not the quotient (Qwen3's head_dim), and QK-norm.
  const std::string width =
      m.head_dim * m.num_heads != m.hidden_size ? fmt::format(" of {}", m.head_dim) : std::string();
  const std::string heads = (m.kv_heads() == m.num_heads
                                 ? fmt::format("{} heads{}", m.num_heads, width)
                                 : fmt::format("{} heads{} in {} key/value groups", m.num_heads, width, m.kv_heads())) +
                            (m.qk_norm ? ", QK-norm" : "") + sliding_window_note(m);
  const int64_t total = total_parameters();  // a collective: every rank logs nothing more but takes part
  // "this rank holds" only when the model is split over ranks (with one rank it would repeat the total).
  const std::string share = num_parameters() == total ? "" : fmt::format("; this rank holds {}", num_parameters());
  // The precision names fp8 when it is on: its GEMMs are what decides the step's speed and numerics.
  const Fp8Config& f8 = cfg_.training.fp8;
  const std::string fp8 =
      f8.enabled()
          ? fmt::format(" with fp8 GEMMs ({}, {} scaling{}{})", name_of(f8.format), name_of(f8.recipe),
                        f8.recipe == Fp8Recipe::delayed ? fmt::format(", amax history {}", f8.amax_history_len) : "",
                        f8.first_last_bf16 ? ", first and last layers bf16" : "")
          : "";
  spdlog::info("model: {} {} parameters ({}{}) ({} layers, hidden {}, {}, ffn {}, vocabulary {} padded to {}), {}{}",
               name_of(m.arch), total, human_count(total), share, m.num_layers, m.hidden_size, heads, m.ffn_hidden_size,
               m.vocab_size, m.padded_vocab_size, name_of(cfg_.training.precision), fp8);
  if (const LoraConfig& l = cfg_.finetune.lora; l.enabled()) {
    const int64_t trainable = total_parameters(/*trainable_only=*/true);
    const MemoryStats& mem = allocator_for(device_).stats();
    auto mib = [&](MemKind k) { return static_cast<double>(mem.current[static_cast<size_t>(k)]) / (1 << 20); };
    spdlog::info(
        "LoRA: rank {}, alpha {}, dropout {} on {}: {} trainable parameters ({}, {:.3f}% of the model), the base "
        "frozen; this rank holds {:.2f} MiB of optimizer state and {:.2f} MiB of gradients beside {:.2f} MiB of "
        "weights",
        l.rank, l.alpha, l.dropout, fmt::join(l.targets, ", "), trainable, human_count(trainable),
        100.0 * static_cast<double>(trainable) / static_cast<double>(total), mib(MemKind::optimizer),
        mib(MemKind::gradient), mib(MemKind::parameter));
  }
  if (m.moe.enabled()) {
    // The experts a token does not visit: (E - top_k) experts' fc1 and fc2 in every MoE layer.
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < m.num_layers; ++l) moe_layers += m.moe.is_moe_layer(l) ? 1 : 0;
    const int64_t F = m.moe.ffn_hidden_size, F1 = m.arch == Arch::llama ? 2 * F : F;
    const int64_t idle = moe_layers * (m.moe.num_experts - m.moe.top_k) * (F1 + F) * m.hidden_size;
    spdlog::info("mixture of experts: {} of {} layers, {} experts (top {}{}{}), {} active parameters per token ({})",
                 moe_layers, m.num_layers, m.moe.num_experts, m.moe.top_k,
                 m.moe.shared_expert_ffn_hidden_size > 0
                     ? fmt::format(", a shared expert of width {}", m.moe.shared_expert_ffn_hidden_size)
                     : std::string(),
                 fmt::format(", {} router", name_of(m.moe.score_function)), total - idle, human_count(total - idle));
  }
}

std::vector<int64_t> Trainer::traced_iterations() const {
  if (!cfg_.logging.trace) return {};
  if (!cfg_.logging.trace_iterations.empty()) return cfg_.logging.trace_iterations;
  std::vector<int64_t> out;  // this run's second and third iterations (the first warms up)
  for (int64_t i = c_.iteration + 2; i <= std::min(c_.iteration + 3, cfg_.training.train_iters); ++i) out.push_back(i);
  if (out.empty() && c_.iteration < cfg_.training.train_iters) out.push_back(c_.iteration + 1);  // a one-step run
  return out;
}

void Trainer::write_trace(int64_t last_iteration) {
  const std::vector<trace::Event> events = trace::take();
  const Topology::Coord at = dist_.topology.coord(dist_.rank());
  const std::string mine = trace::chrome_events(
      events, dist_.rank(), fmt::format("rank {} (tp {} dp {} pp {})", dist_.rank(), at.tp, at.dp, at.pp),
      trace::thread_names());
  const int world = dist_.env.world_size;
  // Every rank's events reach the logging rank through the rendezvous store (no shared file system needed).
  const std::string key = fmt::format("trace/{}/", last_iteration);
  if (world > 1 && !dist_.is_logging_rank()) {
    dist_.store->set(key + std::to_string(dist_.rank()), Bytes(mine.begin(), mine.end()));
    return;
  }
  std::vector<std::string> processes{mine};
  for (int r = 1; r < world; ++r) {
    const Bytes b =
        dist_.store->get(key + std::to_string(r), Millis(static_cast<int64_t>(cfg_.parallel.timeout_s * 1000)));
    processes.emplace_back(b.begin(), b.end());
  }
  const std::filesystem::path path = std::filesystem::path(cfg_.logging.dir) / "trace.json";
  try {
    io::write_file_atomically(path.string(), trace::chrome_trace(processes));
  } catch (const std::exception& e) {
    spdlog::warn("trace: cannot write {}: {}", path.string(), e.what());  // the run goes on without its timeline
    return;
  }
  spdlog::info("timeline of the traced iterations up to {}: {} ({} rank{}; open it in Perfetto or chrome://tracing)",
               last_iteration, path.string(), world, world > 1 ? "s" : "");
}

void Trainer::write_op_profile(const op_profile::Report& r, int64_t iteration) {
  if (!dist_.is_logging_rank()) return;
  const std::string text = op_profile::format_report(r, iteration, 40);
  const std::filesystem::path path = std::filesystem::path(cfg_.logging.dir) / "op_profile.md";
  {
    std::ofstream f(path);
    f << "# " << text;
    if (!f.flush())
      spdlog::warn("op profile: cannot write {} ({}); the log below has the totals", path.string(),
                   std::strerror(errno));
  }
  // The first line and the per-op totals (the file holds the rows by shape too).
  spdlog::info("{}(rows by op and shape: {})", op_profile::format_report(r, iteration, 0), path.string());
  metrics_.write({{"event", "op_profile"},
                  {"iteration", iteration},
                  {"step_ms", r.step_ms},
                  {"op_ms", r.op_ms()},
                  {"device", std::string(device_name(r.device))}});
}

void Trainer::report(const StepResult& r, float lr, double mean_ms, int64_t interval_iters, double flops_per_iter) {
  const trace::Span span("logging", "interval report");
  const int64_t G = cfg_.training.global_batch_size, S = cfg_.model.seq_length;
  read_losses();  // the interval's losses, in one read (and one exchange across ranks)
  const auto now = std::chrono::steady_clock::now();
  const double wall_per_iter = std::chrono::duration<double>(now - last_report_).count() / interval_iters;
  last_report_ = now;
  const std::optional<StragglerVerdict> straggler = watch_stragglers(1000 * wall_per_iter, interval_iters);
  // Ranks differ (pipeline stages above all): the first report and every tenth gathers their peaks.
  const RankPeaks peaks = dist_.env.world_size > 1 && reports_ % 10 == 0 ? gather_peak_memory() : RankPeaks{};
  const AttentionCalls attention = attention_calls();
  // The bytes moved per step since the last report (evaluations and checkpoints of the interval included).
  std::map<std::string, std::map<std::string, double>> comm;
  const CommBytes comm_now = comm_bytes_moved();
  for (const auto& [group, bytes] : comm_now) {
    const auto before = comm_at_report_.find(group);
    for (int op = 0; op < kCommOps; ++op) {
      const int64_t moved = bytes[op] - (before == comm_at_report_.end() ? 0 : before->second[op]);
      if (moved != 0)
        comm[group][std::string(name_of(static_cast<CommOp>(op)))] = static_cast<double>(moved) / interval_iters;
    }
  }
  comm_at_report_ = comm_now;
  report_interval(
      IntervalReport{
          .iteration = c_.iteration,
          .train_iters = cfg_.training.train_iters,
          .consumed_samples = c_.consumed_samples,
          .consumed_tokens = c_.consumed_samples * S,
          .ms_per_iter = mean_ms,
          .tokens_per_s = static_cast<double>(G * S) / (mean_ms / 1000.0),
          // Model FLOP/s per rank (per GPU); MFU against the device's dense bf16 peak where known.
          .tflops_per_gpu = flops_per_iter / (mean_ms / 1000.0) / 1e12 / dist_.env.world_size,
          .peak_tflops = dist_.placement.peak_tflops,
          .lr = lr,
          .loss = interval_loss_ / interval_iters,
          .loss_scale = scaler_.scale(),
          .grad_norm = r.grad_norm,
          .skipped_iters = c_.skipped_iters,
          .nan_iters = c_.nan_iters,
          .peak_bytes = allocator_for(device_).stats().peak_total,
          .host_peak_bytes = host_peak_bytes(),
          .device = device_,
          .elapsed_s = std::chrono::duration<double>(now - started_).count(),
          .eta_s = eta_seconds(c_.iteration, cfg_.training.train_iters, wall_per_iter),
          .fp16 = scaler_.dynamic(),
          .last_overflow = r.found_inf,
          .verbose_line = cfg_.logging.verbose_line,
          .peak_bytes_per_rank = peaks.total,
          .peak_activation_bytes_per_rank = peaks.activations,
          .moe_peak_received = peaks.moe_peak_received,
          .attention = attention,
          .moe = moe_.report([this](std::vector<double> v) { return sum_over_stages_and_replicas(std::move(v)); }),
          .comm_bytes = std::move(comm),
          .straggler = straggler},
      metrics_);
  if (straggler && dist_.is_logging_rank()) {
    spdlog::info("{}", straggler_line(*straggler));
    if (straggler->warn)
      spdlog::warn(
          "rank {} is a straggler: {:.0f}% above its pipeline stage's median busy time for {} intervals in a "
          "row (logging.straggler_margin={}); its peers wait for it in every collective",
          straggler->slowest_rank, 100 * straggler->excess, straggler->intervals_slow, cfg_.logging.straggler_margin);
  }
  log_attention_calls(attention);
  if (reports_ == 0) spdlog::info("peak memory (MiB): {}", memory_summary(device_));
  if (!peaks.total.empty() && dist_.is_logging_rank()) log_peak_memory(peaks);
  ++reports_;
  interval_loss_ = 0;
}

std::optional<StragglerVerdict> Trainer::watch_stragglers(double wall_ms_per_iter, int64_t interval_iters) {
  const int64_t wait_ns = this_thread_comm_wait_ns();
  const double waited_ms = static_cast<double>(wait_ns - comm_wait_at_report_ns_) / 1e6 / interval_iters;
  comm_wait_at_report_ns_ = wait_ns;
  if (dist_.env.world_size <= 1) return std::nullopt;
  std::vector<double> busy(static_cast<size_t>(dist_.env.world_size), 0.0);
  busy[static_cast<size_t>(dist_.rank())] = std::max(0.0, wall_ms_per_iter - waited_ms);
  busy = sum_doubles(*dist_.world, std::move(busy));
  return stragglers_.observe(busy);
}

int64_t Trainer::total_parameters(bool trainable_only) {
  double own = 0, experts = 0;  // exact: parameter counts are far below 2^53
  for (const Parameter* p : params_) {
    if (p->tied_copy || (trainable_only && p->frozen)) continue;
    if (!p->expert) {
      if (counts_in_grad_norm(*p, par_->adam_config())) own += static_cast<double>(par_->stored_numel(p));
    } else if (p->tensor_parallel || dist_.etp_rank() == 0) {  // each expert slice once, as the grad norm does
      experts += static_cast<double>(par_->stored_numel(p));
    }
  }
  // The expert-parallel ranks hold different experts; of a tensor-parallel group only the first fold (tp < ETP)
  // counts them (with parallel folding its other ranks hold the same experts' slices again or other EP ranks').
  if (dist_.ep_size() > 1) experts = sum_doubles(dist_.group({"ep"}), {experts})[0];
  if (dist_.tp_rank() < dist_.etp_size()) own += experts;
  Communicator& mp = dist_.group({"tp", "pp"});
  const double sum = mp.size() > 1 ? sum_doubles(mp, {own})[0] : own;
  return static_cast<int64_t>(std::llround(sum));  // exact: parameter counts are far below 2^53
}

Trainer::RankPeaks Trainer::gather_peak_memory() {
  const auto world = static_cast<size_t>(dist_.env.world_size), rank = static_cast<size_t>(dist_.rank());
  const MemoryStats& m = allocator_for(device_).stats();
  // Every rank's total, then every rank's activations, then every rank's MoE peak received share.
  std::vector<double> peaks(3 * world, 0.0);
  peaks[rank] = static_cast<double>(m.peak_total);
  peaks[world + rank] = static_cast<double>(m.peak[static_cast<size_t>(MemKind::activation)]);
  peaks[2 * world + rank] = moe_.peak_received();
  peaks = sum_doubles(*dist_.world, std::move(peaks));  // exact: byte counts are far below 2^53
  const auto at = [&](size_t block) { return peaks.begin() + static_cast<std::ptrdiff_t>(block * world); };
  return {.total = std::vector<int64_t>(at(0), at(1)),
          .activations = std::vector<int64_t>(at(1), at(2)),
          .moe_peak_received = *std::max_element(at(2), at(3))};
}

void Trainer::log_peak_memory(const RankPeaks& peaks) const {
  const std::vector<int64_t>& total = peaks.total;
  const auto [lo, hi] = std::minmax_element(total.begin(), total.end());
  // Ranks are numbered tp fastest, then cp, then dp, then pp: stage s holds ranks [s * n, (s + 1) * n), n = tp cp dp.
  const int per_stage = dist_.tp_size() * dist_.cp_size() * dist_.dp_size();
  auto by_stage = [&](const std::vector<int64_t>& bytes, int decimals) {
    std::vector<std::string> stages;
    for (int s = 0; s < dist_.pp_size(); ++s)
      stages.push_back(fmt::format(
          "{:.{}f}", *std::max_element(bytes.begin() + s * per_stage, bytes.begin() + (s + 1) * per_stage) / 1048576.0,
          decimals));
    return fmt::format("{}", fmt::join(stages, " | "));
  };
  spdlog::info("peak memory per rank (MiB): min {:.1f} (rank {}), max {:.1f} (rank {}){}", *lo / 1048576.0,
               lo - total.begin(), *hi / 1048576.0, hi - total.begin(),
               dist_.pp_size() > 1 ? fmt::format("; per pipeline stage {}", by_stage(total, 1)) : std::string());
  // The activations alone, which the pipeline schedule decides (issue 27: a zero-bubble schedule's against 1F1B's).
  if (dist_.pp_size() > 1) spdlog::info("peak activation memory by stage (MiB): {}", by_stage(peaks.activations, 2));
}

void Trainer::log_attention_calls(const AttentionCalls& now) {
  const AttentionCalls was = attention_at_report_;
  const AttentionCalls interval{
      .cpu = now.cpu - was.cpu, .cudnn = now.cudnn - was.cudnn, .kernel = now.kernel - was.kernel};
  attention_at_report_ = now;
  const int kinds = (interval.cpu > 0 ? 1 : 0) | (interval.cudnn > 0 ? 2 : 0) | (interval.kernel > 0 ? 4 : 0);
  if (kinds == attention_kinds_) return;
  const bool first = attention_kinds_ < 0;
  attention_kinds_ = kinds;
  const std::string line = fmt::format("attention ran{} (calls this interval, forward and backward): {}",
                                       first ? "" : " differently", attention_calls_summary(interval));
  // cuDNN and the kernel side by side: some calls lost the fused path (the warning above each names why).
  if (interval.cudnn > 0 && interval.kernel > 0)
    spdlog::warn("{}", line);
  else
    spdlog::info("{}", line);
}

}  // namespace mt::app
