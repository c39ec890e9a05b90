// Batched decode attention on the CPU at bloom-560m's size: one token for each of `batch`
// sequences over a paged KV cache of `past` positions each (16 heads x 64, 24 layers, blocks of
// 16 positions, the cache in the CPU backend's own storage), every layer in turn as a decode
// step runs them. A step's cache (24 layers x batch x past x 2 rows of 1024) is far larger than
// the caches, so each layer's rows come from memory as in `kiln bench`. Reports the cache read
// rate in GB/s (Time: one step's attention, all layers); compare with the read bandwidth
// `kiln bench` measures.
// Args: batch, past, 1 = bf16 cache (0: f32), 1 = a layer's weights streamed between layers,
// positions per KV block (the scheduler's kv_block_size: 16).
// Run: KILN_CPU_ISA=avx512|avx2 build/kiln_attention_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/attention_rows.h"
#include "backend/cpu/kernels.h"
#include "core/context.h"
#include "core/cpu_features.h"
#include "core/half.h"

namespace {

using namespace kiln;

constexpr int kLayers = 24, kHeads = 16, kHeadDim = 64;
constexpr int64_t kWidth = kHeads * kHeadDim;

Context& context() {
  static Context ctx(options_from_environment());
  return ctx;
}

void BM_decode_attention(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int64_t past = state.range(1);
  const DType cache_dtype = state.range(2) == 1 ? DType::kBF16 : DType::kF32;
  const int block_size = static_cast<int>(state.range(4));
  std::unique_ptr<Backend> backend = make_cpu_backend(context());
  const KvGeometry geo{kLayers, kWidth, block_size, cache_dtype};
  std::unique_ptr<KvStorage> kv = backend->create_kv_storage(geo);
  // Each step writes the next position, as decoding does (a row rewritten every step stays in
  // the caches): steps cycle through positions past - 16 .. past + 15.
  constexpr int64_t kSpread = 16;
  const int64_t blocks_per_seq = (past + kSpread + block_size - 1) / block_size;
  kv->resize(batch * blocks_per_seq);

  // Blocks handed out as a scheduler does: every sequence's prompt blocks first, then the
  // blocks decode adds, one per sequence in turn.
  const int64_t prompt_blocks =
      std::min<int64_t>((78 + block_size - 1) / block_size, blocks_per_seq);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
  int32_t next = 0;
  for (int s = 0; s < batch; ++s)
    for (int64_t b = 0; b < prompt_blocks; ++b) tables[s].push_back(next++);
  for (int64_t b = prompt_blocks; b < blocks_per_seq; ++b)
    for (int s = 0; s < batch; ++s) tables[s].push_back(next++);

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  const int64_t block_elems = block_size * kWidth;
  for (int32_t b = 0; b < next; ++b)
    for (int l = 0; l < kLayers; ++l)
      for (void* p : {kv->key_block(l, b), kv->value_block(l, b)})
        for (int64_t i = 0; i < block_elems; ++i) {
          if (cache_dtype == DType::kBF16)
            static_cast<uint16_t*>(p)[i] = float_to_bf16(u(rng));
          else
            static_cast<float*>(p)[i] = u(rng);
        }

  std::vector<StepLayout> layouts(2 * kSpread);
  for (int64_t i = 0; i < 2 * kSpread; ++i) {
    layouts[i].clear();
    for (int s = 0; s < batch; ++s)
      layouts[i].add_sequence(1, past - kSpread + i, tables[s], nullptr);
  }
  StepContext step{&layouts[0], kv.get()};
  int64_t iteration = 0;

  Tensor qkv = Tensor::empty(DType::kF32, {batch, 3 * kWidth});
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.data<float>()[i] = u(rng);
  Tensor y = Tensor::empty(DType::kF32, {batch, kWidth});
  std::vector<Node> nodes(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    AttentionAttrs a;
    a.kind = AttentionKind::kCachedSelf;
    a.bias = PositionBias::kAlibi;
    a.layer = l;
    a.num_heads = kHeads;
    a.head_dim = kHeadDim;
    a.causal = true;
    a.packed_qkv = true;
    a.scale = 0.125f;
    nodes[l].op = OpKind::kAttention;
    nodes[l].name = "attn";
    nodes[l].attrs = a;
  }
  const Tensor in[] = {qkv};
  Tensor out[] = {y};
  const cpu::KernelEnv env{context().pool(), &step};
  // The kernel the backend runs: AVX-512 loops where the context's family is AVX-512.
  const auto kernel =
      context().cpu_isa() == CpuIsa::kAvx512 ? cpu::attention_avx512 : cpu::attention;
  // A decode step streams a layer's weights (bloom-560m bf16: 25 MB) between two attention
  // layers; with range(3) set, the bench reads that much between layers too (not timed), so
  // the caches and TLBs hold what they would hold in a real step.
  const int64_t flush_floats = state.range(3) * (int64_t{25} << 20) / 4;
  std::vector<float> weights(static_cast<size_t>(flush_floats), 1.0f);
  std::vector<float> sink(static_cast<size_t>(context().pool().size()) * 16);
  const auto stream_weights = [&] {
    context().pool().parallel_for(flush_floats, 1 << 16, [&](int64_t b, int64_t e) {
      float sum = 0;
      for (int64_t i = b; i < e; i += 16) sum += weights[i];
      sink[static_cast<size_t>(b / std::max<int64_t>(1, flush_floats / 2)) * 16] += sum;
    });
  };
  for (auto _ : state) {
    step.layout = &layouts[iteration++ % (2 * kSpread)];
    if (flush_floats > 0) {
      double seconds = 0;
      for (int l = 0; l < kLayers; ++l) {
        stream_weights();
        const auto t0 = std::chrono::steady_clock::now();
        kernel(nodes[l], std::span<const Tensor>(in), std::span<Tensor>(out), env);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      state.SetIterationTime(seconds);
      continue;
    }
    for (int l = 0; l < kLayers; ++l)
      kernel(nodes[l], std::span<const Tensor>(in), std::span<Tensor>(out), env);
    benchmark::ClobberMemory();
  }
  const double bytes = static_cast<double>(kLayers) * 2 * batch * (past + 1) *
                       static_cast<double>(dtype_bytes(cache_dtype, kWidth));
  state.counters["cache_GB/s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}

// Batch 16 at `kiln bench`'s mean decode position (prompt 78, 64 new tokens), batch 1, and a
// longer context.
BENCHMARK(BM_decode_attention)
    ->Args({16, 109, 1, 0, 16})
    ->Args({16, 109, 0, 0, 16})
    ->Args({1, 109, 1, 0, 16})
    ->Args({4, 109, 1, 0, 16})
    ->Args({16, 500, 1, 0, 16})
    ->Args({16, 109, 1, 0, 32})
    ->Args({16, 109, 0, 0, 32})
    ->UseRealTime();
BENCHMARK(BM_decode_attention)
    ->Args({16, 109, 1, 1, 16})
    ->Args({16, 109, 0, 1, 16})
    ->Args({1, 109, 1, 1, 16})
    ->Args({16, 109, 1, 1, 32})
    ->Args({16, 109, 0, 1, 32})
    ->UseManualTime();

// One encoder prompt's self-attention, one thread, in the AVX-512 register tiles
// (attention_prompt.cc): flan-t5-base's 12 heads of 64 over range(0) tokens, q/k/v packed as
// fuse_qkv leaves them, T5's relative bias. Time: every head of one layer.
void BM_prompt_heads(benchmark::State& state) {
  if (!detect_cpu_features().avx512f) {
    state.SkipWithError("no AVX-512 here");
    return;
  }
  constexpr int64_t kT5Heads = 12, kT5Width = kT5Heads * 64;
  const int64_t tokens = state.range(0);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> qkv(static_cast<size_t>(tokens * 3 * kT5Width)), y(tokens * kT5Width);
  for (float& v : qkv) v = u(rng);
  std::vector<float> bias(static_cast<size_t>(kT5Heads * (2 * tokens + 1)));
  for (float& v : bias) v = u(rng);
  std::vector<float> scratch(static_cast<size_t>(cpu::prompt_head_scratch_floats(tokens, 64)));
  for (auto _ : state) {
    for (int64_t h = 0; h < kT5Heads; ++h) {
      cpu::PromptHead p{qkv.data(),
                        qkv.data() + kT5Width,
                        qkv.data() + 2 * kT5Width,
                        y.data(),
                        3 * kT5Width,
                        3 * kT5Width,
                        kT5Width,
                        tokens,
                        h,
                        64};
      p.t5_bias = bias.data() + h * (2 * tokens + 1) + tokens;
      cpu::prompt_head_avx512(p, scratch.data());
    }
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_prompt_heads)->Arg(78)->Arg(512);

}  // namespace

BENCHMARK_MAIN();
