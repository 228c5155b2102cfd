// test_cudnn_graphs.cpp: every cuDNN SDPA graph megatrain builds passes the cuDNN frontend's validate() for
// Hopper (sm_90), checked without a GPU (the frontend takes the SM version instead of asking the device), so a
// graph the frontend rejects is found in CI and not in the first minutes of a lent GPU. The graphs: forward and
// backward (deterministic, and the benchmarks' non-deterministic one), bf16 and fp16, causal and not, at the
// shapes every file in configs/ gives a tensor-parallel rank (each TP size that divides its key/value heads) at
// the config's sequence length and the benchmarks' (1024, 2048, 4096), and the CUDA op tests' small shapes.
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

TEST(CudnnGraphs, EveryGraphValidatesForHopper) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN (or without the cuDNN frontend headers)";
  const std::vector<cuda::CudnnSdpaGraph> graphs = every_graph();
  ASSERT_GE(graphs.size(), 100u) << "the configs should give many shapes";
  int failed = 0;
  for (const auto& g : graphs) {
    const std::string why = cuda::cudnn_attention_validate(g, kHopper);
    if (!why.empty() && ++failed <= 20) ADD_FAILURE() << why;
  }
  EXPECT_EQ(failed, 0) << "of " << graphs.size() << " graphs";
  std::cout << graphs.size() << " cuDNN SDPA graphs validate for sm_" << kHopper << "\n";
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
