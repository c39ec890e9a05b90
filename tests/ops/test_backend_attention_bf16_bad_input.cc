// Attention beside the op table, part two: the CPU's bf16 KV cache and bf16 cross K/V against the
// reference on the rounded values, and bad step layouts and cross K/V rejected by every backend.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "../models/graph_runner.h"
#include "attention_scenarios.h"
#include "backend_ops.h"
#include "core/half.h"
#include "passes/pass.h"
#include "runtime/kv_cache.h"

namespace kiln::test {
namespace {

// The message of the error `f` throws, or "no error".
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// t replaced by a copy whose elements are rounded to the nearest bf16 (ties to even) and kept in
// f32, those of its columns below `from_col` excepted (a packed qkv's q columns stay f32).
void round_to_bf16(Tensor& t, int64_t from_col = 0) {
  t = t.clone();
  float* x = t.data<float>();
  const int64_t cols = t.dim(-1);
  for (int64_t i = 0; i < t.numel(); ++i)
    if (i % cols >= from_col) x[i] = bf16_to_float(float_to_bf16(x[i]));
}

// Every CPU backend's outputs of `narrow` against the reference's outputs of `rounded` (the same
// scenario on the rounded f32 values); returns how many backends were checked.
int expect_cpu_matches_rounded(Backend& reference, const Scenario& narrow, const Scenario& rounded,
                               const std::string& label) {
  const ScenarioOutputs want = run_scenario(reference, rounded);
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    if (nb.backend->device() != Device::kCpu) continue;
    const ScenarioOutputs got = run_scenario(*nb.backend, narrow);
    for (size_t s = 0; s < got.size(); ++s)
      expect_matches(got[s][0], want[s][0], Check{CheckKind::kMaxRelative, 1e-5},
                     fmt::format("{}{} step {}", nb.name, label, s));
    ++checked;
  }
  return checked;
}

// A bf16 KV cache (what the CPU keeps for bf16 plans): the keys and values are rounded to the
// nearest bf16 (ties to even) as they are stored and widened exactly as they are read, so every
// output equals the reference's with the step's k and v rounded first and an f32 cache. Forks,
// copy-on-write and chunked prefill included; packed qkv and separate inputs.
TEST(BackendOps, CpuBf16KvCacheStoresRoundedKeysAndValues) {
  const std::unique_ptr<Backend> reference = reference_backend();
  AttnConfig t5_block4 = t5_cached();
  t5_block4.block_size = 4;
  t5_block4.head_dim = 12;  // rows of 8-lane vectors and a remainder
  int checked = 0;
  for (const auto& [c, steps] :
       {std::pair{alibi_cached_packed(), kSharedPrefix}, std::pair{t5_block4, kChunkedPrefill}}) {
    Gen g(DType::kF32, DType::kF32, 11);
    const Scenario f32 = cached_scenario(g, c, steps);
    Scenario bf16 = f32, rounded = f32;
    bf16.kv->dtype = DType::kBF16;
    const int64_t W = c.width();
    for (ScenarioStep& step : rounded.steps)
      for (auto& [name, t] : step.feed) {
        if (name != "q") round_to_bf16(t, name == "qkv" ? W : 0);
      }
    checked += expect_cpu_matches_rounded(*reference, bf16, rounded, "");
  }
  EXPECT_GT(checked, 0);
}

// bf16 cross K/V (what the CPU keeps for T5's bf16 and int8-weight plans, made by
// Allocator::copy_row_groups_as): every output equals the reference's over the same keys and
// values rounded to bf16 and kept in f32. Heads 64 wide (the 16-row AVX-512 loops) and 20 wide
// (the row-at-a-time ones); ragged sequences, one of them a prompt of several rows.
TEST(BackendOps, CpuBf16CrossKvReadsRoundedKeysAndValues) {
  const std::unique_ptr<Backend> reference = reference_backend();
  int checked = 0;
  for (int head_dim : {64, 20}) {
    AttnConfig c;
    c.kind = AttentionKind::kCross;
    c.heads = 4;
    c.head_dim = head_dim;
    c.scale = 0.125f;
    Gen g(DType::kF32, DType::kF32, 12);
    const Scenario f32 = cross_scenario(g, c, {37, 78, 5}, {1, 1, 9}, {20, 3, 0});
    Scenario bf16 = f32, rounded = f32;
    for (size_t i = 0; i < f32.cross.size(); ++i) {
      std::vector<Tensor> parts;
      for (int l = 0; l < kLayers; ++l) {
        parts.push_back(f32.cross[i].keys[l]);
        parts.push_back(f32.cross[i].values[l]);
      }
      const int64_t bounds[] = {0, parts.front().dim(0)};
      const std::vector<std::vector<Tensor>> narrow =
          host_allocator().copy_row_groups_as(parts, bounds, DType::kBF16);
      for (int l = 0; l < kLayers; ++l) {
        ASSERT_EQ(narrow[0][2 * l].dtype(), DType::kBF16);
        bf16.cross[i].keys[l] = narrow[0][2 * l];
        bf16.cross[i].values[l] = narrow[0][2 * l + 1];
        round_to_bf16(rounded.cross[i].keys[l]);
        round_to_bf16(rounded.cross[i].values[l]);
      }
    }
    checked += expect_cpu_matches_rounded(*reference, bf16, rounded,
                                          fmt::format(" head_dim {}", head_dim));
  }
  EXPECT_GT(checked, 0);
}

// Cross K/V whose types differ between sequences, or are neither f32 nor bf16: a clear error.
TEST(BackendOps, BadInputCrossKvOfMixedTypes) {
  AttnConfig c;
  c.kind = AttentionKind::kCross;
  c.heads = 2;
  c.head_dim = 32;
  Gen g(DType::kF32, DType::kF32, 13);
  Scenario mixed = cross_scenario(g, c, {4, 4}, {1, 1}, {0, 0});
  std::vector<Tensor> parts = {mixed.cross[1].keys[c.layer], mixed.cross[1].values[c.layer]};
  const int64_t bounds[] = {0, 4};
  const auto narrow = host_allocator().copy_row_groups_as(parts, bounds, DType::kBF16);
  mixed.cross[1].keys[c.layer] = narrow[0][0];
  mixed.cross[1].values[c.layer] = narrow[0][1];
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    if (nb.backend->device() != Device::kCpu) continue;
    EXPECT_NE(
        error_of([&] { run_scenario(*nb.backend, mixed); }).find("every sequence's must be f32"),
        std::string::npos)
        << nb.name;
    ++checked;
  }
  EXPECT_GT(checked, 0);
  // Only host f32 rows are rounded; other conversions are refused.
  const Tensor ints = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4, 1});
  const int64_t four[] = {0, 4};
  EXPECT_NE(error_of([&] {
              host_allocator().copy_row_groups_as({&ints, 1}, four, DType::kBF16);
            }).find("takes host bf16 or f32 rows"),
            std::string::npos);
}

// HostRowGroups (copy_row_groups_as on the host, and what a streamed CPU encoder fills one
// projection at a time): each group's buffer holds its own rows of every part, f32 rounded to
// bf16 to nearest even, bf16 copied as is; a part of the wrong shape or type, or one never
// filled, is a clear error.
TEST(BackendOps, HostRowGroupsHoldEachGroupsRowsOfEveryPart) {
  const int64_t bounds[] = {0, 3, 3, 5};  // the middle group has no rows
  HostRowGroups groups(host_allocator(), {{4}, {2, 3}}, bounds, DType::kBF16);
  std::vector<float> a(5 * 4), b(5 * 6);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 1.0f + 0.0078125f * i + 1e-5f * i;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -3.0f + 0.33f * i;
  std::vector<uint16_t> b_bf16(b.size());
  for (size_t i = 0; i < b.size(); ++i) b_bf16[i] = float_to_bf16(b[i]);
  const Tensor part_a = Tensor::from_vector(a, {5, 4});
  const Tensor part_b = Tensor::view(DType::kBF16, {5, 2, 3}, b_bf16.data(), nullptr, Device::kCpu);
  groups.fill(0, part_a);
  EXPECT_NE(error_of([&] { groups.take(); }).find("part 1 was never filled"), std::string::npos);
  const Tensor short_b = Tensor::from_vector(std::vector<float>(4 * 6), {4, 2, 3});
  EXPECT_NE(error_of([&] { groups.fill(1, short_b); }).find("of shape [5, 2, 3]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { groups.fill(2, part_a); }).find("part 2 of 2"), std::string::npos);
  groups.fill(1, part_b);
  const std::vector<std::vector<Tensor>> out = groups.take();
  ASSERT_EQ(out.size(), 3u);
  for (int g = 0; g < 3; ++g) {
    const int64_t begin = bounds[g], rows = bounds[g + 1] - bounds[g];
    ASSERT_EQ(out[g].size(), 2u);
    EXPECT_EQ(out[g][0].shape(), (Shape{rows, 4}));
    EXPECT_EQ(out[g][1].shape(), (Shape{rows, 2, 3}));
    EXPECT_EQ(out[g][0].dtype(), DType::kBF16);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(out[g][1].raw()) % 64, 0u) << "parts 64-byte aligned";
    const auto* ka = static_cast<const uint16_t*>(out[g][0].raw());
    const auto* kb = static_cast<const uint16_t*>(out[g][1].raw());
    for (int64_t i = 0; i < rows * 4; ++i) EXPECT_EQ(ka[i], float_to_bf16(a[begin * 4 + i]));
    for (int64_t i = 0; i < rows * 6; ++i) EXPECT_EQ(kb[i], b_bf16[begin * 6 + i]);
  }
}

// The bad-input tests' attention: causal, cached, two heads of two.
AttnConfig tiny_cached() {
  AttnConfig c;
  c.kind = AttentionKind::kCachedSelf;
  c.heads = 2;
  c.head_dim = 2;
  c.causal = true;
  c.layer = 0;
  return c;
}

TEST(BackendOps, BadInputStepLayout) {
  std::vector<NamedBackend> backends = available_backends();
  backends.push_back({"reference", nullptr, reference_backend()});
  AttnConfig c = tiny_cached();
  Gen g(DType::kF32, DType::kF32, 3);
  const Graph cached = attention_graph(g, c);
  c.kind = AttentionKind::kCross;
  c.causal = false;
  const Graph cross = attention_graph(g, c);
  const Tensor q = g.random({3, 4});
  const std::vector<Tensor> cached_in = {q, q, q}, cross_in = {q};
  for (NamedBackend& nb : backends) {
    Backend& be = *nb.backend;
    auto exe = be.compile(cached, test_profile());
    EXPECT_THROW(exe->execute(cached_in, nullptr), Error) << nb.name << ": no layout";
    auto storage = be.create_kv_storage({1, 4, 2, DType::kF32});
    storage->resize(2);
    StepLayout layout;
    layout.clear();
    const std::vector<int32_t> one_block = {0};
    layout.add_sequence(3, 0, one_block, nullptr);  // room for two of the three tokens
    StepContext step{&layout, nullptr};
    EXPECT_THROW(exe->execute(cached_in, &step), Error) << nb.name << ": no KV storage";
    step.kv = storage.get();
    EXPECT_THROW(exe->execute(cached_in, &step), Error) << nb.name << ": block table too short";
    layout.clear();
    const std::vector<int32_t> two_blocks = {0, 1};
    layout.add_sequence(2, 0, two_blocks, nullptr);
    EXPECT_THROW(exe->execute(cached_in, &step), Error) << nb.name << ": covers 2 of 3 tokens";
    layout.clear();
    const std::vector<int32_t> hole = {-1, 1};  // the check of the last block misses it
    layout.add_sequence(3, 0, hole, nullptr);
    // Found by the kernel: a device backend may report it only when the output is read.
    EXPECT_THROW(be.allocator().to_host(exe->execute(cached_in, &step)[0]), Error)
        << nb.name << ": no block for position 0";
    layout.clear();
    layout.add_sequence(3, 0, two_blocks, nullptr);
    auto wide = be.create_kv_storage({1, 6, 2, DType::kF32});
    wide->resize(2);
    step.kv = wide.get();
    EXPECT_THROW(exe->execute(cached_in, &step), Error) << nb.name << ": KV rows of another width";
    step.kv = storage.get();
    EXPECT_NO_THROW(exe->execute(cached_in, &step)) << nb.name << ": the good layout";

    auto cross_exe = be.compile(cross, test_profile());
    StepLayout no_cross;
    no_cross.clear();
    no_cross.add_sequence(3, 0, {}, nullptr);
    const StepContext cross_step{&no_cross, nullptr};
    EXPECT_THROW(cross_exe->execute(cross_in, &cross_step), Error)
        << nb.name << ": cross attention without cross K/V";
  }
}

// Bad data a kernel finds in a step whose results are never read (CUDA returns from a KV step
// before the GPU is done) is still reported, by the next execute(), naming the node, and the
// steps after it run normally.
TEST(BackendOps, BadInputUnreadStepIsReportedByTheNextStep) {
  Gen g(DType::kF32, DType::kF32, 5);
  const Graph cached = attention_graph(g, tiny_cached());
  const Tensor q = g.random({3, 4});
  const std::vector<Tensor> in = {q, q, q};
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    Backend& be = *nb.backend;
    auto exe = be.compile(cached, test_profile());
    auto storage = be.create_kv_storage({1, 4, 2, DType::kF32});
    storage->resize(2);
    StepLayout bad, good;
    bad.clear();
    good.clear();
    const std::vector<int32_t> hole = {-1, 1}, blocks = {0, 1};
    bad.add_sequence(3, 0, hole, nullptr);
    good.add_sequence(3, 0, blocks, nullptr);
    StepContext bad_step{&bad, storage.get()}, good_step{&good, storage.get()};
    // Good steps first: on CUDA the step is then run eagerly, captured, and replayed, so the
    // bad steps below replay the captured graph with a bad block table.
    for (int i = 0; i < 3; ++i)
      EXPECT_NO_THROW(be.allocator().to_host(exe->execute(in, &good_step)[0])) << nb.name;
    std::string error;
    try {
      exe->execute(in, &bad_step);   // a host backend throws here
      exe->execute(in, &good_step);  // a device one here, for the unread step
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("node 'attn'"), std::string::npos) << nb.name << ": " << error;
    EXPECT_NE(error.find("KV block -1"), std::string::npos) << nb.name << ": " << error;
    // Read through the device argmax: the wait for its ids reports the step.
    error.clear();
    try {
      const std::span<const Tensor> y = exe->execute(in, &bad_step);
      std::vector<int64_t> ids(static_cast<size_t>(y[0].dim(0)));
      be.token_selector().argmax_rows(y[0], ids, {}, {});
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("KV block -1"), std::string::npos) << nb.name << ": " << error;
    Tensor out;
    EXPECT_NO_THROW(out = be.allocator().to_host(exe->execute(in, &good_step)[0])) << nb.name;
    EXPECT_TRUE(out.defined()) << nb.name;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace kiln::test
