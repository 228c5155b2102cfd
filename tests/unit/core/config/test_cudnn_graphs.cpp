// test_cudnn_graphs.cpp: every cuDNN SDPA graph megatrain builds passes the cuDNN frontend's validate() for
// Hopper (sm_90), checked without a GPU (the frontend takes the SM version instead of asking the device), so a
// graph the frontend rejects is found in CI and not in the first minutes of a lent GPU. The graphs: forward and
// backward (deterministic, and the benchmarks' non-deterministic one), bf16 and fp16, causal and not, at the
// shapes every file in configs/ gives a tensor-parallel rank (each TP size that divides its key/value heads) at
// the config's sequence length and the benchmarks' (1024, 2048, 4096), and the CUDA op tests' small shapes; and the
// context-parallel ring's block graphs at CP 2 and 4 (with which call each chunk pair is).
// The later steps (operation graph, heuristics, plans) need a device; test_cuda_ops runs them on a GPU.
// It lives with core/config's tests, the lowest room that holds both what it reads (every file in configs/, through
// load_config) and what it checks (core/cuda's graph builder, in mt_tensor below it).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/config/config.h"
#include "core/tensor/ops.h"
#include "tests/unit/source_root.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/attention_cudnn.h"
#endif

namespace mt {
namespace {

#if defined(MEGATRAIN_WITH_CUDA)

constexpr int kHopper = 90;

// One rank's attention shape: qkv (B, T, G, R + 2, D).
struct Shape5 {
  int64_t B, T, G, R, D;
  auto operator<=>(const Shape5&) const = default;
};

// The shapes the files in configs/ give a rank, for every TP size that splits their key/value heads.
std::set<Shape5> config_shapes() {
  std::set<Shape5> shapes;
  for (const auto& e : std::filesystem::directory_iterator(testing_util::source_root() / "configs")) {
    if (e.path().extension() != ".yaml") continue;
    const std::string path = e.path().string();
    const Config cfg = load_config(path, {}, layout_world_size(path, {}));
    const ModelConfig& m = cfg.model;
    const int64_t R = m.num_heads / m.kv_heads();
    for (int64_t tp : {1, 2, 4, 8}) {
      if (m.kv_heads() % tp != 0) continue;
      for (int64_t T : {m.seq_length, int64_t{1024}, int64_t{2048}, int64_t{4096}})
        for (int64_t B : {cfg.training.micro_batch_size, int64_t{4}})
          shapes.insert({B, T, m.kv_heads() / tp, R, m.head_dim});
    }
  }
  return shapes;
}

std::vector<cuda::CudnnSdpaGraph> every_graph() {
  std::set<Shape5> shapes = config_shapes();
  // test_cuda_ops' cuDNN cases: GPT-like, grouped-query (R = 2, 4) and multi-query (G = 1), odd T.
  for (Shape5 s : {Shape5{2, 64, 4, 1, 64}, Shape5{2, 33, 2, 2, 64}, Shape5{1, 128, 2, 4, 128}, Shape5{3, 17, 1, 4, 64},
                   Shape5{2, 256, 4, 1, 32}})
    shapes.insert(s);
  std::vector<cuda::CudnnSdpaGraph> graphs;
  for (const Shape5& s : shapes)
    for (DType dtype : {DType::bf16, DType::f16})
      for (bool causal : {true, false}) {
        const cuda::CudnnSdpaGraph g{
            .dtype = dtype, .B = s.B, .T = s.T, .G = s.G, .R = s.R, .D = s.D, .causal = causal};
        graphs.push_back(g);  // forward
        for (bool deterministic : {true, false}) {
          cuda::CudnnSdpaGraph b = g;
          b.backward = true;
          b.deterministic = deterministic;
          graphs.push_back(b);
        }
      }
  return graphs;
}

// Every graph of `graphs` validates for Hopper (the first 20 failures reported).
void expect_all_validate(const std::vector<cuda::CudnnSdpaGraph>& graphs, const char* what) {
  int failed = 0;
  for (const auto& g : graphs) {
    const std::string why = cuda::cudnn_attention_validate(g, kHopper);
    if (!why.empty() && ++failed <= 20) ADD_FAILURE() << why;
  }
  EXPECT_EQ(failed, 0) << "of " << graphs.size() << " " << what;
  std::cout << graphs.size() << " cuDNN " << what << " validate for sm_" << kHopper << "\n";
}

// The context-parallel ring's block graphs (cudnn_block_of's three calls at CP 2 and 4: the own block causal, an
// earlier rank's first chunk and a later rank's keys for the second query chunk, full) at each shape's local
// sequence T / CP, forward and deterministic backward.
std::vector<cuda::CudnnSdpaGraph> ring_block_graphs() {
  std::set<Shape5> shapes = config_shapes();
  for (Shape5 s : {Shape5{2, 64, 2, 2, 64}, Shape5{1, 64, 3, 1, 32}, Shape5{1, 32, 1, 4, 64}}) shapes.insert(s);
  std::vector<cuda::CudnnSdpaGraph> graphs;
  for (const Shape5& s : shapes)
    for (int64_t cp : {2, 4}) {
      if (s.T % (2 * cp) != 0) continue;
      const int64_t T = s.T / cp, c = T / 2;
      for (DType dtype : {DType::bf16, DType::f16})
        for (auto [q_rows, k_rows, causal] : {std::tuple{T, T, true}, {T, c, false}, {c, T, false}})
          for (bool backward : {false, true})
            graphs.push_back({.backward = backward,
                              .dtype = dtype,
                              .B = s.B,
                              .T = T,
                              .G = s.G,
                              .R = s.R,
                              .D = s.D,
                              .causal = causal,
                              .q_rows = q_rows,
                              .Tk = T,
                              .k_rows = k_rows});
    }
  return graphs;
}

TEST(CudnnGraphs, RingBlockGraphsValidateForHopper) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN (or without the cuDNN frontend headers)";
  const std::vector<cuda::CudnnSdpaGraph> graphs = ring_block_graphs();
  ASSERT_GE(graphs.size(), 50u);
  expect_all_validate(graphs, "ring-block graphs");
}

// Which one SDPA call a block of CP's chunk pairs is (cudnn_block_of), and what one call cannot express.
TEST(CudnnGraphs, RingBlocksAreOneCallEach) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN (or without the cuDNN frontend headers)";
  const int64_t c = 8, T = 2 * c;  // CP = 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
  const SequencePositions r0{.position_offset = 0, .split_at = c, .split_position = 3 * c};
  const SequencePositions r1{.position_offset = c, .split_at = c, .split_position = 2 * c};
  std::string why;
  cuda::CudnnBlock b = cuda::cudnn_block_of(T, T, {.q = r0, .k = r0}, &why);  // own: causal over all rows
  EXPECT_EQ(why, "");
  EXPECT_TRUE(b.causal);
  EXPECT_EQ(std::tuple(b.q0, b.q_rows, b.k0, b.k_rows), std::tuple(int64_t{0}, T, int64_t{0}, T));
  b = cuda::cudnn_block_of(T, T, {.q = r1, .k = r0}, &why);  // an earlier rank: its first chunk, every query
  EXPECT_EQ(why, "");
  EXPECT_FALSE(b.causal);
  EXPECT_EQ(std::tuple(b.q0, b.q_rows, b.k0, b.k_rows), std::tuple(int64_t{0}, T, int64_t{0}, c));
  b = cuda::cudnn_block_of(T, T, {.q = r0, .k = r1}, &why);  // a later rank: all its keys, the second query chunk
  EXPECT_EQ(why, "");
  EXPECT_FALSE(b.causal);
  EXPECT_EQ(std::tuple(b.q0, b.q_rows, b.k0, b.k_rows), std::tuple(c, c, int64_t{0}, T));
  b = cuda::cudnn_block_of(T, T, {.q = {.position_offset = 0}, .k = {.position_offset = 100}}, &why);
  EXPECT_EQ(why, "");
  EXPECT_TRUE(b.empty());
  // Keys overlapping the queries' positions without being the same rows: partly visible, two calls' worth.
  cuda::cudnn_block_of(T, T, {.q = {.position_offset = 0}, .k = {.position_offset = 4}}, &why);
  EXPECT_NE(why.find("partly visible"), std::string::npos) << why;
}

TEST(CudnnGraphs, EveryGraphValidatesForHopper) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN (or without the cuDNN frontend headers)";
  const std::vector<cuda::CudnnSdpaGraph> graphs = every_graph();
  ASSERT_GE(graphs.size(), 100u) << "the configs should give many shapes";
  expect_all_validate(graphs, "SDPA graphs");
}

// validate() is a real check: a graph the frontend must reject comes back refused, with the reason: a head
// dimension that is not a multiple of 8, and any graph for a GPU older than Ampere (so the SM version counts).
TEST(CudnnGraphs, InvalidGraphsAreRefused) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN (or without the cuDNN frontend headers)";
  const cuda::CudnnSdpaGraph good{.dtype = DType::bf16, .B = 2, .T = 128, .G = 4, .R = 1, .D = 64};
  EXPECT_EQ(cuda::cudnn_attention_validate(good, kHopper), "");
  cuda::CudnnSdpaGraph odd = good;
  odd.D = 12;
  const std::string why_odd = cuda::cudnn_attention_validate(odd, kHopper);
  EXPECT_NE(why_odd.find("validate (sm_90)"), std::string::npos) << why_odd;
  EXPECT_NE(why_odd.find("multiple of 8"), std::string::npos) << why_odd;
  const std::string why_turing = cuda::cudnn_attention_validate(good, 75);
  EXPECT_NE(why_turing.find("validate (sm_75)"), std::string::npos) << why_turing;
  const std::string f32 = cuda::cudnn_attention_validate({.dtype = DType::f32}, kHopper);
  EXPECT_NE(f32.find("bf16 or fp16"), std::string::npos) << f32;
}

#else

TEST(CudnnGraphs, EveryGraphValidatesForHopper) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif

}  // namespace
}  // namespace mt
