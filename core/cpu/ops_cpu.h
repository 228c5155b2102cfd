// ops_cpu.h: the CPU reference backend of core/ops.h. Arguments arrive checked (shapes, dtypes, devices)
// by core/ops.cpp; values are read as fp32, computed in fp32 (statistics in double where cheap) and rounded
// once to the output dtype, so a bf16/f16 op equals the fp32 op on the same values, rounded.
#pragma once
#include "core/ops.h"

namespace mt::cpu {

// gemm.cpp
void gemm(const Tensor& a, const Tensor& b, Tensor& out, const GemmOptions& opt);

// elementwise.cpp
void add_bias(Tensor& x, const Tensor& bias);
void bias_backward(const Tensor& dout, Tensor& dbias);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void scale_(Tensor& x, float s);
void gelu_forward(const Tensor& x, Tensor& out);
void gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx);

// layernorm.cpp
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out, Tensor& mean,
                       Tensor& rstd, const LayerNormOptions& opt);
void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias);

// embedding.cpp
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, const EmbeddingOptions& opt);
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, const EmbeddingOptions& opt);
void position_embedding_add(Tensor& x, const Tensor& wpe, const EmbeddingOptions& opt);
void position_embedding_backward(const Tensor& dout, Tensor& dwpe, const EmbeddingOptions& opt);

// dropout.cpp (x and out are (B, T, C))
void dropout_forward(const Tensor& x, Tensor& out, const DropoutOptions& opt);
void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOptions& opt);

// attention.cpp
void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt);
void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                        const AttentionOptions& opt);

// cross_entropy.cpp
void cross_entropy_rowmax(const Tensor& logits, Tensor& rowmax, const CrossEntropyOptions& opt);
void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, Tensor& sumexp,
                            Tensor& target_logit, const CrossEntropyOptions& opt);
void cross_entropy_loss(const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit, Tensor& losses);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, const Tensor& sumexp,
                            const Tensor& dloss, Tensor& dlogits, const CrossEntropyOptions& opt);

// optimizer_ops.cpp
double sum_squares(const Tensor& x);
bool has_inf_or_nan(const Tensor& x);
void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWOptions& opt);

}  // namespace mt::cpu
