// moe_mlp.h: a mixture-of-experts MLP (model.moe), built from the op layer's MoE ops: the router (fp32 logits of a
// bias-free linear C -> E, then moe_router_forward: top_k experts and their weights), the token dispatch
// (moe_dispatch_index, moe_permute: each expert's tokens a contiguous row slice), each expert's MLP as GEMMs on its
// slice (the architecture's own: GELU for gpt, SwiGLU for llama; no biases), and the weighted sum back per token
// (moe_unpermute); backward the same way in reverse. Parameters are named by global expert index
// (<prefix>.router.weight, <prefix>.experts.<e>.fc1.weight, <prefix>.experts.<e>.fc2.weight), so an
// expert-parallel layout holds a subset of the same names. With model.moe.shared_expert_ffn_hidden_size, a shared
// expert (DeepSeek's, ungated: <prefix>.shared_expert.fc1/fc2.weight) that every token passes adds its output.
//
// Load balancing (Megatron-Core's forms, per microbatch of N tokens): the auxiliary loss (Switch / GShard)
// aux_loss_coeff * E / (k N^2) * sum_e P_e T_e, with P_e the sum over tokens of expert e's score (softmax; sigmoid:
// each row's scores over their sum) and T_e the tokens routed to e, and the router z-loss z_loss_coeff * mean over
// tokens of logsumexp(logits)^2; both join the objective as the microbatch's language-model loss does (their
// gradients scaled by the same d(objective)/d(loss)) but not the reported loss. DeepSeek-V3's aux-loss-free
// balancing adds a per-expert bias to the scores for the choice only; the trainer moves it after each step
// (update_expert_bias).
//
// Tensor parallelism (parallel.expert_tensor = parallel.tensor, Megatron's default, without expert parallelism):
// every TP rank routes all N tokens of the microbatch (gathered from sequence shards with sequence parallelism)
// with the replicated router, and holds a slice of every expert's and the shared expert's MLP (fc1's rows, fc2's
// columns, as the dense column- and row-parallel linears); the weighted partial outputs are summed over the group
// (reduce-scattered to sequence shards with SP) as a row-parallel output is. The router's gradient is the same on
// every TP rank (a replica); its input gradient joins the sum once (on TP rank 0).
//
// Expert parallelism (parallel/layers/expert_parallel.h): this rank holds E / ep of the experts; each forward sends its
// tokens' choices to the EP ranks holding their experts and gets their outputs back (all-to-all, counts exchanged
// first), each backward the same for the gradients. Every EP rank computes the same values as one rank would.
//
// Parallel folding (parallel.expert_tensor = ETP < T, Megatron-Core's): the experts are split over ETP ranks only,
// and the T / ETP folds of a tensor-parallel group (fold tp / ETP) hold other experts (drawn into the expert-parallel
// group) or the same ones again (in the expert-data-parallel group). Every TP rank still routes every token (so
// routing, capacity and the load are one rank's); fold f dispatches only its share of each expert's choices (the
// f-th of T / ETP even parts of the expert's rows), and the outputs of the other folds' shares join in the
// tensor-parallel sum as the expert slices' partial sums do.
//
// Capacity (model.moe.capacity_factor): each expert keeps its ceil(factor * N * k / E) heaviest choices of the
// microbatch; a dropped choice adds nothing to its token's output (the residual carries the token). With context
// parallelism N is the whole microbatch's: the context ranks gather each other's choices and weights and decide
// the drops over all of them in one rank's token order (ties to the lower token), each keeping its own part.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/tensor/ops.h"
#include "core/tensor/parameter.h"
#include "core/tensor/tensor.h"
#include "models/moe_expert_lora.h"
#include "parallel/layers/context_parallel.h"
#include "parallel/layers/expert_parallel.h"
#include "parallel/layers/tensor_parallel.h"

namespace mt {

// One MoE layer's routing over the training forwards since it was last taken (MoeMlp::take_load).
struct MoeLoad {
  std::vector<int64_t> tokens;  // (E) choices per expert: each token counts once for each of its top_k experts
  double aux = 0;               // sum over microbatches of the auxiliary loss without its coefficient (1: balanced)
  double z = 0;                 // sum over microbatches of the z-loss without its coefficient
  int64_t dropped = 0;          // choices dropped for capacity (model.moe.capacity_factor)
  int64_t microbatches = 0;
};

// What one microbatch's pass needs besides its rows.
struct MoeStep {
  int64_t samples = 1;  // B: the rows are B samples' (sequence shards of each with sequence parallelism)
  bool record = false;  // forward: count this routing in the load (training's forward, not a recomputation)
  float dloss = 1.f;    // backward: d(objective)/d(the microbatch's loss); the aux and z losses join with it
};

class MoeMlp {
 public:
  // cfg.moe.enabled(); `prefix` e.g. "layers.3.mlp"; values in `dtype`, initialised from `seed` (fc2 with
  // `output_init_std`, Megatron's scaled init of output projections, the others with cfg.init_std); `tp` the
  // tensor-parallel group the experts are split over (their slices hold exactly the whole tensors' values).
  // `ep`: the expert-parallel group; this rank holds experts [ep.first(E), ep.first(E) + ep.count(E)), split over
  // the experts' tensor-parallel degree ep.tensor (0: tp.size) as tp.rank % ETP. `cp`: the context-parallel group,
  // whose ranks hold the other chunks of the microbatch's sequences: the aux and z losses are the microbatch's, so
  // their token counts, score sums and log-sum-exps are summed over it.
  // `lora` (finetune.lora, when it targets fc1 or fc2): adapters on the experts' and the shared expert's linears
  // (models/moe_expert_lora.h).
  MoeMlp(const ModelConfig& cfg, const std::string& prefix, DType dtype, float output_init_std, uint64_t seed,
         Device device = Device::cpu, TensorParallel tp = {}, ExpertParallel ep = {}, ContextParallel cp = {},
         const LoraConfig& lora = {});

  // What forward keeps for backward.
  struct Saved {
    Tensor x;                       // (N, C) the input, all N tokens (gathered with sequence parallelism)
    Tensor logits;                  // (N, E) f32, kept for the aux and z losses' gradients (else undefined)
    Tensor scores, experts, probs;  // (N, E) f32, (N, k) i32, (N, k) f32
    Tensor row_of;                  // (N, k) i32
    std::vector<int64_t> counts;    // (E) this rank's kept choices per expert, on the host
    std::vector<int64_t> routed;    // (E) its choices per expert before the capacity drops some (= counts without)
    // With the aux or z loss: `routed` and N summed over the context ranks (the whole microbatch's), else this rank's.
    std::vector<int64_t> routed_all;
    int64_t tokens_all = 0;
    std::vector<int64_t> sent;  // (E) the kept choices per expert this rank dispatches (counts without folding)
    Tensor share;               // (Rs, 1) i32: with parallel folding, the rows of `counts` this rank dispatches
    // The rows of this rank's experts, expert-major: xp (Re, C), h (Re, F1/t), act (Re, F/t); Re = N*k without
    // expert parallelism. y (N*k, C): this rank's choices' outputs, by expert (partial sums with TP; with parallel
    // folding only this fold's share, the other rows zero).
    Tensor xp, h, act, y;
    std::vector<int64_t> expert_rows;  // (E / ep) rows of each of this rank's experts
    // Expert parallelism only: rows sent to and received from each EP rank, and each received row's expert-major
    // row (Re, 1) i32.
    std::vector<int64_t> send_rows, recv_rows;
    Tensor order;
    Tensor shared_h, shared_act;  // the shared expert's (N, Fs1/t) and (N, Fs/t); undefined without one
    ExpertLoraSaved lora;         // the experts' adapters' low-rank rows
    LoraSaved shared_lora1, shared_lora2;
  };
  // x (Ns, C) -> (Ns, C): Ns = N rows, or this rank's sequence shard with sequence parallelism.
  Tensor forward(const Tensor& x, Saved& s, const MoeStep& step = {}) const;
  // dout (Ns, C) -> dx (Ns, C); accumulates every parameter's gradient (with the aux and z losses' share).
  Tensor backward(const Tensor& dout, const Saved& s, const MoeStep& step = {});

  // The router's weight, fc1 and fc2 of each expert in expert order (each followed by its adapters), then the shared
  // expert's fc1 and fc2 and their adapters.
  std::vector<Parameter*> parameters();
  // Folds the adapters into the experts' and shared expert's weights and drops them (generation).
  void merge_lora();
  Parameter& router() { return router_; }
  // Expert e (a global index) of this rank's.
  Parameter& fc1(int64_t e) { return fc1_.at(static_cast<size_t>(e - first_expert_)); }
  Parameter& fc2(int64_t e) { return fc2_.at(static_cast<size_t>(e - first_expert_)); }
  bool has_shared_expert() const { return shared_fc1_.value.defined(); }
  Parameter& shared_fc1() { return shared_fc1_; }
  Parameter& shared_fc2() { return shared_fc2_; }
  const std::string& prefix() const { return prefix_; }

  // Selective recomputation (training.recompute_modules: moe_act): drops the experts' and shared expert's
  // activations from `s` after forward, and recomputes them from s.h and s.shared_h before backward.
  void drop_activations(Saved& s) const;
  void recompute_activations(Saved& s) const;

  // The routing recorded since the last call (then cleared).
  MoeLoad take_load();
  // The most rows this rank's experts received in one forward over their balanced share (expert parallelism; 0
  // without): what `megatrain plan --moe-imbalance` takes, as metrics.jsonl's moe_peak_received reports it.
  double peak_received() const { return peak_received_; }
  // DeepSeek-V3's aux-loss-free balancing (model.moe.bias_update_rate > 0): bias_e += rate * sign(mean - T_e)
  // with T_e the tokens routed to expert e over a whole step (every microbatch of every data-parallel rank).
  bool has_expert_bias() const { return expert_bias_.defined(); }
  void update_expert_bias(const std::vector<int64_t>& tokens);
  std::vector<float> expert_bias() const;  // (E) on the host; empty without one
  void set_expert_bias(const std::vector<float>& bias);

 private:
  MoeRouterOptions router_options() const;
  // With a capacity factor: s.row_of and this rank's kept counts, the drops decided over the whole microbatch of
  // `samples` samples (every context rank's chunks of it, so every layout drops one rank's choices).
  void capacity_dispatch(Saved& s, int64_t samples, Tensor& counts) const;
  // Parallel folding: which of the kept rows this fold dispatches (sets s.sent and s.share), those rows of `rows`,
  // and they back in place among `kept` rows (the others zero). Without folding, all: the rows themselves.
  void plan_share(Saved& s) const;
  Tensor take_share(const Tensor& rows, const Saved& s) const;
  Tensor put_share(const Tensor& rows, const Saved& s, int64_t kept) const;
  // Expert parallelism (models/moe_mlp.cpp): the exchange's counts and order, and the rows there and back.
  void plan_exchange(Saved& s) const;
  Tensor to_experts(const Tensor& rows, const Saved& s) const;
  Tensor from_experts(const Tensor& rows, const Saved& s) const;
  void all_to_all_rows(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                       const std::vector<int64_t>& recv_rows) const;
  // Adds a training forward's routing (and its aux and z losses, where configured) to load_.
  void record_load(const Tensor& logits, const Saved& s) const;

  ModelConfig cfg_;
  std::string prefix_;
  DType dtype_;
  Device device_;
  TensorParallel tp_;
  ContextParallel cp_;
  ExpertParallel ep_;
  int fold_ = 0, folds_ = 1;           // parallel folding: this rank's fold tp / ETP of the T / ETP
  int64_t first_expert_ = 0;           // this rank's first expert (global index)
  Parameter router_;                   // (E, C), replicated over TP
  std::vector<Parameter> fc1_;         // per local expert (F1/ETP, C): F1 = F, or 2F gate and up interleaved (llama)
  std::vector<Parameter> fc2_;         // per local expert (C, F/ETP)
  Parameter shared_fc1_, shared_fc2_;  // (Fs1/t, C), (C, Fs/t); undefined without a shared expert
  ExpertAdapters lora_;                // finetune.lora's, beside fc1 and fc2 (none without)
  Tensor expert_bias_;                 // (E) f32 on the device; undefined without the bias update
  mutable MoeLoad load_;               // bookkeeping of forward (const: generation runs it too)
  // Expert parallelism: the most rows this rank's experts received in one forward over their balanced share (the
  // EP group's choices times this rank's share of the experts), since the layer was made; 0 without EP.
  mutable double peak_received_ = 0;
};

}  // namespace mt
