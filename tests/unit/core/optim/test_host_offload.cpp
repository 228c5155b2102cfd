// test_host_offload.cpp: the optimizer offload's host step (core/optim/host_offload.h) against the fused AdamW on
// the gradients' device: the same masters, moments and values bit for bit over several steps, however the state
// is cut into chunks and threads, with gaps between segments (a shard's padding), weight decay on some segments
// and values in bf16 or fp32; the host pool's accounting apart from the device's; and the same on a GPU (pinned
// buffers, the copy stream), which skips without one.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/optim/host_offload.h"
#include "core/tensor/allocator.h"
#include "tests/unit/gpu_test.h"
#include "tests/unit/op_test_util.h"

namespace mt {
namespace {

using test::make;
using test::rand_vec;

// A state of 1000 elements in four segments, [0, 300) [300, 301) [310, 700) [705, 1000): a one-element segment and
// gaps that no segment covers (never updated).
const std::vector<HostOffload::Segment> kSegments = {{.begin = 0, .end = 300, .decay = true},
                                                     {.begin = 300, .end = 301, .decay = false},
                                                     {.begin = 310, .end = 700, .decay = false},
                                                     {.begin = 705, .end = 1000, .decay = true}};
constexpr int64_t kN = 1000;

AdamWOptions options(int64_t step) {
  return {
      .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = step, .grad_scale = 0.5f};
}

std::vector<uint32_t> bits(const Tensor& t) {
  const Tensor host = t.device() == Device::cpu ? t : t.to(Device::cpu);
  std::vector<uint32_t> out((host.nbytes() + 3) / 4);
  std::memcpy(out.data(), host.raw(), host.nbytes());
  return out;
}

// Three steps through HostOffload (chunk elements and threads as given) and through adamw_multi_step on `device`,
// from the same initial masters and gradients; every master, moment and value equal bit for bit.
void expect_same_as_device_step(Device device, DType value_dtype, int64_t chunk, int threads) {
  const Tensor init = make(rand_vec(kN, 1), {kN});
  // The reference: the device's state and the device step.
  Tensor master = init.to(device), m = Tensor::zeros({kN}, DType::f32, device),
         v = Tensor::zeros({kN}, DType::f32, device);
  Tensor ref_value = Tensor::zeros({kN}, value_dtype, device);
  // The offload: host state, device gradients and values.
  HostOffload off(kN, kSegments, value_dtype, device, {.enabled = true, .chunk_elements = chunk, .threads = threads});
  Tensor(off.master()).copy_from(init);
  Tensor value = Tensor::zeros({kN}, value_dtype, device);
  for (int64_t step = 1; step <= 3; ++step) {
    const Tensor grad = make(rand_vec(kN, 10 + static_cast<uint32_t>(step)), {kN}).to(device);
    std::vector<AdamWTensors> ts;
    std::vector<Tensor> grads, values;
    for (const HostOffload::Segment& s : kSegments) {
      ts.push_back({.master = master.slice(s.begin, s.end),
                    .grad = grad.slice(s.begin, s.end),
                    .exp_avg = m.slice(s.begin, s.end),
                    .exp_avg_sq = v.slice(s.begin, s.end),
                    .value = value_dtype == DType::f32 ? Tensor() : ref_value.slice(s.begin, s.end),
                    .decay = s.decay});
      grads.push_back(grad.slice(s.begin, s.end));
      values.push_back(value.slice(s.begin, s.end));
    }
    adamw_multi_step(ts, options(step));
    off.step(options(step), grads, values);
  }
  EXPECT_EQ(bits(off.master()), bits(master));
  EXPECT_EQ(bits(off.exp_avg()), bits(m));
  EXPECT_EQ(bits(off.exp_avg_sq()), bits(v));
  // The device values: the rounded masters (fp32: the masters) of every segment's elements; the gaps untouched.
  const Tensor expected = value_dtype == DType::f32 ? master : ref_value;
  const std::vector<uint32_t> got = bits(value), want = bits(expected);
  const size_t per_word = 4 / dtype_size(value_dtype);
  for (const HostOffload::Segment& s : kSegments)
    for (int64_t i = s.begin; i < s.end; i += static_cast<int64_t>(per_word))
      ASSERT_EQ(got[static_cast<size_t>(i) / per_word], want[static_cast<size_t>(i) / per_word]) << "element " << i;
  EXPECT_EQ(value.slice(301, 310).to_floats(), std::vector<float>(9, 0.f));  // a gap: never written
}

TEST(HostOffload, StepsAsTheFusedAdamWBitForBitOnTheCpu) {
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t chunk : {int64_t{1000}, int64_t{64}, int64_t{333}})  // 1000: a quarter of the state, 250
      for (int threads : {1, 3}) {
        SCOPED_TRACE(test::str(dtype_name(dt), " chunk ", chunk, " threads ", threads));
        expect_same_as_device_step(Device::cpu, dt, chunk, threads);
      }
}

TEST(HostOffload, SplitsLargeChunksOverThreadsWithTheSameBits) {
  // 16384 elements per part at least: chunks of 75000 (a quarter of the state) run on 4 threads; compared with one.
  const int64_t n = 300000;
  const std::vector<HostOffload::Segment> segs = {{.begin = 0, .end = 40001, .decay = true},
                                                  {.begin = 40001, .end = n, .decay = false}};
  std::vector<std::vector<uint32_t>> out;
  for (int threads : {1, 4}) {
    HostOffload off(n, segs, DType::bf16, Device::cpu, {.enabled = true, .chunk_elements = n, .threads = threads});
    Tensor(off.master()).copy_from(make(rand_vec(n, 3), {n}));
    const Tensor grad = make(rand_vec(n, 4), {n});
    Tensor value = Tensor::zeros({n}, DType::bf16);
    off.step(options(1), {grad.slice(0, 40001), grad.slice(40001, n)}, {value.slice(0, 40001), value.slice(40001, n)});
    out.push_back(bits(off.master()));
    out.push_back(bits(value));
  }
  EXPECT_EQ(out[0], out[2]);
  EXPECT_EQ(out[1], out[3]);
}

TEST(HostOffload, HostPoolIsCountedApartFromTheDeviceTotal) {
  const MemoryStats before = allocator_for(Device::cpu).stats();
  {
    HostOffload off(kN, kSegments, DType::bf16, Device::cpu, {.enabled = true, .chunk_elements = 100});
    const MemoryStats during = allocator_for(Device::cpu).stats();
    const int64_t expected = offload_host_bytes(kN, DType::bf16, {.enabled = true, .chunk_elements = 100});
    EXPECT_EQ(expected, 12 * kN + 2 * 100 * (4 + 2));
    EXPECT_EQ(during.host_current - before.host_current, expected);
    EXPECT_EQ(during.current[static_cast<size_t>(MemKind::host)] - before.current[static_cast<size_t>(MemKind::host)],
              expected);
    EXPECT_EQ(during.current_total, before.current_total);  // the device total does not see it
  }
  EXPECT_EQ(allocator_for(Device::cpu).stats().host_current, before.host_current);
  // fp32 values are copied from the masters: no value staging.
  EXPECT_EQ(offload_host_bytes(kN, DType::f32, {.enabled = true, .chunk_elements = 100}), 12 * kN + 2 * 100 * 4);
  EXPECT_EQ(offload_host_bytes(kN, DType::f32, {.enabled = false}), 0);
}

TEST(HostOffload, RefusesGradientsOfTheWrongShape) {
  HostOffload off(kN, kSegments, DType::f32, Device::cpu, {.enabled = true});
  const Tensor g = Tensor::zeros({kN}, DType::f32);
  EXPECT_THROW(off.step(options(1), {g}, {g}), std::logic_error);
  const std::vector<HostOffload::Segment> outside = {{.begin = 5, .end = 11}};
  const OffloadOptions on{.enabled = true};
  EXPECT_THROW(HostOffload(10, outside, DType::f32, Device::cpu, on), std::logic_error);
}

// On a GPU: device gradients and values, pinned host state, the copy stream; the same bits as the device's own
// fused AdamW (the CPU and CUDA updates are equal bit for bit), with chunks that pipeline.
class HostOffloadGpu : public test::CudaOps {};

TEST_F(HostOffloadGpu, StepsAsTheDeviceFusedAdamWBitForBit) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (int64_t chunk : {int64_t{1000}, int64_t{64}}) {
      SCOPED_TRACE(test::str(dtype_name(dt), " chunk ", chunk));
      expect_same_as_device_step(Device::cuda, dt, chunk, 2);
    }
}

}  // namespace
}  // namespace mt
