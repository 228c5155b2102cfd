// config_enums.h: the choices a config key names (config.h's enums) and the names a file spells them by.
#pragma once
#include <array>

#include "core/base/dtype.h"
#include "core/base/enum_names.h"

namespace mt {

// The keys that name one of a few choices are enums, parsed once when the config is read (an unknown name is
// an error naming the key, the choices and the place in the file) and written back by name. Each enum's names
// are listed in EnumNames (core/base/enum_names.h), in the order of its values; `planned` names are known but
// not implemented yet. The learning-rate schedule's (LrDecay, WsdShape) stand beside it, in core/optim.
// gpt: GPT-2/3 (LayerNorm, GELU MLP, learned positions, biases, tied embeddings); llama: RMSNorm, SwiGLU MLP,
// rotary positions, grouped-query attention, no biases, untied embeddings.
enum class Arch { gpt, llama };
enum class Precision { fp32, bf16, fp16 };
enum class Recompute { none, full, selective };
enum class DeviceChoice { automatic, cuda, cpu };
enum class BackendChoice { automatic, nccl, gloo };
enum class OptimizerType { adamw };
enum class SpikeAction { log, skip, stop };
enum class SinkErrorAction { warn, save_and_stop };
enum class MoeScore { softmax, sigmoid };
enum class Fp8Format { none, e4m3, hybrid };
enum class Fp8Recipe { current, delayed };
enum class Fp8AmaxAlgo { max, most_recent };
// parallel.pipeline_schedule: auto (1F1B, interleaved with virtual_pipeline > 1), or one by name.
enum class PipelineSchedule { automatic, one_f_one_b, interleaved, zb_h1, zb_v };
// parallel.shard: what the data-parallel ranks split among themselves (the ZeRO stages): nothing, the optimizer
// state (ZeRO-1, also parallel.distributed_optimizer: true), that and the gradients (ZeRO-2), and the parameters
// too (ZeRO-3: each layer gathered around its forward and backward). Ordered: each stage shards what the one before
// does.
enum class ShardStage { none, optimizer, gradients, parameters };
enum class LossMaskChoice { automatic, on, off };
enum class SftPacking { concat, pad, pack };
// parallel.context_comm: how context-parallel attention meets the other ranks' keys and values (ring passes them
// around the context group; allgather gathers them all at once and reduce-scatters their gradients).
enum class ContextComm { p2p, allgather };

template <>
struct EnumNames<Arch> {
  static constexpr std::array names{"gpt", "llama"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<Precision> {
  static constexpr std::array names{"fp32", "bf16", "fp16"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<Recompute> {
  static constexpr std::array names{"none", "full", "selective"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<DeviceChoice> {
  static constexpr std::array names{"auto", "cuda", "cpu"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<BackendChoice> {
  static constexpr std::array names{"auto", "nccl", "gloo"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<PipelineSchedule> {
  static constexpr std::array names{"auto", "1f1b", "interleaved", "zb-h1", "zb-v"};
  static constexpr std::array<const char*, 1> planned{"dualpipe-v"};
};
template <>
struct EnumNames<ShardStage> {
  static constexpr std::array names{"none", "optimizer", "gradients", "parameters"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<LossMaskChoice> {
  static constexpr std::array names{"auto", "true", "false"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<SftPacking> {
  static constexpr std::array names{"concat", "pad", "pack"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<ContextComm> {
  static constexpr std::array names{"p2p", "allgather"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<OptimizerType> {
  static constexpr std::array names{"adamw"};
  static constexpr std::array<const char*, 0> planned{};
};

template <>
struct EnumNames<SpikeAction> {
  static constexpr std::array names{"log", "skip", "stop"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<SinkErrorAction> {
  static constexpr std::array names{"warn", "save_and_stop"};
  static constexpr std::array<const char*, 0> planned{};
};

template <>
struct EnumNames<Fp8Format> {
  static constexpr std::array names{"none", "e4m3", "hybrid"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<Fp8Recipe> {
  static constexpr std::array names{"current", "delayed"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<Fp8AmaxAlgo> {
  static constexpr std::array names{"max", "most_recent"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<MoeScore> {
  static constexpr std::array names{"softmax", "sigmoid"};
  static constexpr std::array<const char*, 0> planned{};
};

// The compute dtype of a precision.
inline DType dtype_of(Precision p) {
  return p == Precision::bf16 ? DType::bf16 : p == Precision::fp16 ? DType::f16 : DType::f32;
}

}  // namespace mt
