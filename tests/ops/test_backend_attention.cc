// Attention in the op table (encoder self, cached self through the paged KV cache over several
// steps, cross), and the attention checks beside it: the reference's paged path against whole
// sequences, batch invariance of the fast backends, and bad step layouts rejected everywhere.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>

#include "../models/graph_runner.h"
#include "backend_ops.h"
#include "core/half.h"
#include "passes/pass.h"
#include "runtime/kv_cache.h"

namespace kiln::test {
namespace {

struct AttnConfig {
  AttentionKind kind = AttentionKind::kEncoderSelf;
  PositionBias bias = PositionBias::kNone;
  int heads = 3;
  int head_dim = 4;
  bool causal = false;
  bool packed = false;
  float scale = 1.0f;
  bool bidirectional = true;  // T5: bidirectional buckets exactly when not causal
  int buckets = 8;
  int max_distance = 6;
  int layer = 1;  // of kLayers: a kernel must pick its own layer's cache / cross K/V
  int block_size = 2;
  int64_t width() const { return static_cast<int64_t>(heads) * head_dim; }
};
constexpr int kLayers = 2;

AttentionAttrs attrs_of(const AttnConfig& c) {
  AttentionAttrs a;
  a.kind = c.kind;
  a.bias = c.bias;
  a.layer = c.layer;
  a.num_heads = c.heads;
  a.head_dim = c.head_dim;
  a.causal = c.causal;
  a.packed_qkv = c.packed;
  a.scale = c.scale;
  a.bidirectional_buckets = c.bidirectional;
  a.num_buckets = c.buckets;
  a.max_distance = c.max_distance;
  return a;
}

// q, k, v [tokens, H*dh] (or qkv [tokens, 3*H*dh] laid out [3, H, dh], or q alone for cross),
// the relative-bias table [buckets, H] when T5 -> y [tokens, H*dh]
Graph attention_graph(Gen& g, const AttnConfig& c) {
  GraphBuilder b("attention");
  const int64_t W = c.width();
  int q = -1, k = -1, v = -1;
  if (c.packed) {
    q = b.input("qkv", g.dtype(), {kTokens, Dim::of(3 * W)});
  } else {
    q = b.input("q", g.dtype(), {kTokens, Dim::of(W)});
    if (c.kind != AttentionKind::kCross) {
      k = b.input("k", g.dtype(), {kTokens, Dim::of(W)});
      v = b.input("v", g.dtype(), {kTokens, Dim::of(W)});
    }
  }
  const int table = c.bias == PositionBias::kT5Relative
                        ? b.weight("rel", g.random({c.buckets, c.heads}, -3, 3))
                        : -1;
  b.output(b.attention(q, k, v, table, attrs_of(c), "attn"), "y");
  return b.finish();
}

// Feeds for rows of q, k and v (each [n, W] flattened), packed when the config says so.
std::map<std::string, Tensor> qkv_feed(const Gen& g, const AttnConfig& c,
                                       const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v) {
  const int64_t W = c.width(), n = static_cast<int64_t>(q.size()) / W;
  if (!c.packed)
    return {{"q", g.tensor(q, {n, W})}, {"k", g.tensor(k, {n, W})}, {"v", g.tensor(v, {n, W})}};
  std::vector<float> packed;
  for (int64_t r = 0; r < n; ++r)
    for (const std::vector<float>* m : {&q, &k, &v})
      packed.insert(packed.end(), m->begin() + r * W, m->begin() + (r + 1) * W);
  return {{"qkv", g.tensor(packed, {n, 3 * W})}};
}

// Encoder self attention over ragged sequences of `lengths` in one step.
Scenario encoder_scenario(Gen& g, const AttnConfig& c, const std::vector<int64_t>& lengths) {
  Scenario s;
  s.graph = attention_graph(g, c);
  int64_t n = 0;
  StepLayout layout;
  layout.clear();
  for (int64_t len : lengths) {
    layout.add_sequence(len, 0, {}, nullptr);
    n += len;
  }
  const std::vector<float> q = g.floats(n * c.width(), -2, 2), k = g.floats(n * c.width(), -2, 2),
                           v = g.floats(n * c.width());
  s.steps.push_back(ScenarioStep{qkv_feed(g, c, q, k, v), layout, {}});
  return s;
}

// Cross attention: sequence s has dec[s] query tokens after past[s] decoded ones, and its own
// cross K/V of enc[s] rows in each of kLayers layers.
Scenario cross_scenario(Gen& g, const AttnConfig& c, const std::vector<int64_t>& enc,
                        const std::vector<int64_t>& dec, const std::vector<int64_t>& past) {
  Scenario s;
  s.graph = attention_graph(g, c);
  StepLayout layout;
  layout.clear();
  ScenarioStep step;
  int64_t n = 0;
  for (size_t i = 0; i < enc.size(); ++i) {
    CrossKv kv;
    for (int l = 0; l < kLayers; ++l) {
      kv.keys.push_back(g.random({enc[i], c.width()}, -2, 2));
      kv.values.push_back(g.random({enc[i], c.width()}));
    }
    s.cross.push_back(std::move(kv));
    layout.add_sequence(dec[i], past[i], {}, nullptr);
    step.cross.push_back(static_cast<int>(i));
    n += dec[i];
  }
  step.feed = {{"q", g.random({n, c.width()}, -2, 2)}};
  step.layout = layout;
  s.steps.push_back(std::move(step));
  return s;
}

// Cached self attention over several steps. Before a step, `forks` make sequence `child` share
// every block of `parent` (a beam fork); `run` lists the sequences of the step, in batch order,
// with their new token counts. Blocks come from the runtime's block manager, so shared partly
// filled blocks are copied on write through the layout's block copies.
struct SeqRun {
  int seq;
  int64_t tokens;
};
struct CachedStep {
  std::vector<std::pair<int, int>> forks;  // (child, parent)
  std::vector<SeqRun> run;
};

// Where a step's rows belong: sequence `seq`, positions [pos, pos + tokens), rows from `row`.
struct Placement {
  size_t step;
  int64_t row;
  int seq;
  int64_t pos;
  int64_t tokens;
};
// Every sequence's q, k, v rows in position order ([len, W] flattened), for whole-sequence checks.
struct History {
  std::vector<std::vector<float>> q, k, v;
  std::vector<Placement> placements;
};

Scenario cached_scenario(Gen& g, const AttnConfig& c, const std::vector<CachedStep>& steps,
                         History* history = nullptr) {
  Scenario s;
  s.graph = attention_graph(g, c);
  const int64_t W = c.width();
  s.kv = KvGeometry{kLayers, W, c.block_size, g.dtype()};
  std::unique_ptr<KvStorage> bookkeeping = reference_backend()->create_kv_storage(*s.kv);
  BlockManager blocks(*bookkeeping);
  std::vector<SequenceKv> seqs;
  History h;
  for (const CachedStep& cs : steps) {
    for (auto [child, parent] : cs.forks) {
      const size_t need = static_cast<size_t>(std::max(child, parent)) + 1;
      if (seqs.size() < need) seqs.resize(need);
      if (h.q.size() < need) h.q.resize(need), h.k.resize(need), h.v.resize(need);
      seqs[child] = seqs[parent].fork(blocks);
      h.q[child] = h.q[parent], h.k[child] = h.k[parent], h.v[child] = h.v[parent];
    }
    StepLayout layout;
    layout.clear();
    std::vector<float> q, k, v;
    int64_t row = 0;
    for (const SeqRun& r : cs.run) {
      const size_t need = static_cast<size_t>(r.seq) + 1;
      if (seqs.size() < need) seqs.resize(need);
      if (h.q.size() < need) h.q.resize(need), h.k.resize(need), h.v.resize(need);
      SequenceKv& kv = seqs[r.seq];
      h.placements.push_back({s.steps.size(), row, r.seq, kv.length(), r.tokens});
      kv.prepare_append(blocks, r.tokens, &layout.copies);
      layout.add_sequence(r.tokens, kv.length(), kv.blocks(), nullptr);
      const std::vector<float> nq = g.floats(r.tokens * W, -2, 2),
                               nk = g.floats(r.tokens * W, -2, 2), nv = g.floats(r.tokens * W);
      for (auto [step_rows, seq_rows, fresh] :
           {std::tuple{&q, &h.q[r.seq], &nq}, std::tuple{&k, &h.k[r.seq], &nk},
            std::tuple{&v, &h.v[r.seq], &nv}}) {
        step_rows->insert(step_rows->end(), fresh->begin(), fresh->end());
        seq_rows->insert(seq_rows->end(), fresh->begin(), fresh->end());
      }
      row += r.tokens;
    }
    for (const SeqRun& r : cs.run) seqs[r.seq].commit(r.tokens);
    s.steps.push_back(ScenarioStep{qkv_feed(g, c, q, k, v), layout, {}});
  }
  s.kv_blocks = bookkeeping->capacity();
  for (SequenceKv& kv : seqs) kv.release(blocks);
  if (history) *history = std::move(h);
  return s;
}

AttnConfig t5_encoder() {
  AttnConfig c;
  c.bias = PositionBias::kT5Relative;
  return c;
}
AttnConfig alibi_cached_packed() {  // BLOOM: 6 heads for the non-power-of-two slopes
  AttnConfig c;
  c.kind = AttentionKind::kCachedSelf;
  c.bias = PositionBias::kAlibi;
  c.heads = 6;
  c.causal = true;
  c.packed = true;
  c.scale = 0.5f;
  return c;
}
AttnConfig t5_cached() {  // T5 decoder: causal buckets, unscaled
  AttnConfig c;
  c.kind = AttentionKind::kCachedSelf;
  c.bias = PositionBias::kT5Relative;
  c.heads = 6;
  c.causal = true;
  c.bidirectional = false;
  c.max_distance = 10;
  return c;
}

// Prefill 4 and 3 tokens in one batch, then one token each twice, the batch order reversed.
const std::vector<CachedStep> kPrefillThenDecode = {
    {{}, {{0, 4}, {1, 3}}}, {{}, {{0, 1}, {1, 1}}}, {{}, {{1, 1}, {0, 1}}}};
// A prompt of 5 (its last block half full) forked into three beams that decode and fork again: a
// beam writing into a last block it still shares gets a copy of it first.
const std::vector<CachedStep> kSharedPrefix = {{{}, {{0, 5}}},
                                               {{{1, 0}, {2, 0}}, {{0, 1}, {1, 1}, {2, 1}}},
                                               {{}, {{2, 1}, {0, 1}, {1, 1}}},
                                               {{{3, 1}}, {{3, 1}, {1, 1}}}};
// Chunked prefill beside decoding sequences, past max_distance (10) for the clamped bucket.
const std::vector<CachedStep> kChunkedPrefill = {
    {{}, {{0, 4}}}, {{}, {{0, 3}, {1, 5}}}, {{}, {{1, 7}, {0, 1}}}, {{}, {{0, 1}, {1, 1}}}};

}  // namespace

std::vector<OpCase> attention_op_cases() {
  const Check check{CheckKind::kMaxRelative};
  std::vector<OpCase> cases;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    cases.push_back({"Attention_encoder_t5_bidirectional_ragged_9_4" + dtype_suffix(dtype),
                     dtype,
                     {check},
                     [](Gen& g) {
                       return encoder_scenario(g, t5_encoder(), {9, 4});
                     }});
  cases.push_back(
      {"Attention_encoder_t5_6heads_dh32_ragged_12_7", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c = t5_encoder();  // t5-tiny's shape and table
         c.heads = 6;
         c.head_dim = 32;
         c.buckets = 32;
         c.max_distance = 128;
         return encoder_scenario(g, c, {12, 7});
       }});
  cases.push_back(
      {"Attention_encoder_causal_scaled_ragged_3_6_1", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c;
         c.causal = true;
         c.scale = 0.5f;
         return encoder_scenario(g, c, {3, 6, 1});
       }});
  cases.push_back(
      {"Attention_encoder_alibi_packed_causal_6heads_ragged_5_2", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c = alibi_cached_packed();
         c.kind = AttentionKind::kEncoderSelf;
         return encoder_scenario(g, c, {5, 2});
       }});
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    cases.push_back(
        {"Attention_cached_alibi_packed_prefill_then_decode" + dtype_suffix(dtype),
         dtype,
         {check},
         [](Gen& g) { return cached_scenario(g, alibi_cached_packed(), kPrefillThenDecode); }});
  // T5 self attention with q, k and v stacked (fuse_qkv, CPU and CUDA plans): relative bias
  // over packed rows, bidirectional in the encoder, causal over the cache in the decoder.
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    cases.push_back({"Attention_encoder_t5_packed_ragged_9_4" + dtype_suffix(dtype),
                     dtype,
                     {check},
                     [](Gen& g) {
                       AttnConfig c = t5_encoder();
                       c.packed = true;
                       return encoder_scenario(g, c, {9, 4});
                     }});
    cases.push_back({"Attention_cached_t5_packed_prefill_then_decode" + dtype_suffix(dtype),
                     dtype,
                     {check},
                     [](Gen& g) {
                       AttnConfig c = t5_cached();
                       c.packed = true;
                       return cached_scenario(g, c, kPrefillThenDecode);
                     }});
  }
  cases.push_back(
      {"Attention_cached_t5_causal_prefill_then_decode", DType::kF32, {check}, [](Gen& g) {
         return cached_scenario(g, t5_cached(), {{{}, {{0, 11}, {1, 3}}}, {{}, {{0, 1}, {1, 1}}}});
       }});
  cases.push_back(
      {"Attention_cached_nobias_scaled_prefill_then_decode", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c = t5_cached();
         c.bias = PositionBias::kNone;
         c.scale = 0.3f;
         return cached_scenario(g, c, kPrefillThenDecode);
       }});
  cases.push_back(
      {"Attention_cached_alibi_shared_prefix_copy_on_write", DType::kF32, {check}, [](Gen& g) {
         return cached_scenario(g, alibi_cached_packed(), kSharedPrefix);
       }});
  cases.push_back({"Attention_cached_t5_chunked_prefill_block4", DType::kF32, {check}, [](Gen& g) {
                     AttnConfig c = t5_cached();
                     c.block_size = 4;
                     return cached_scenario(g, c, kChunkedPrefill);
                   }});
  // Prompts long enough for a GPU's tiled prefill kernel (64 query rows a block, keys in chunks
  // of 32 through shared memory): tiles that span sequences, partial key chunks, and a chunked
  // prompt beside a decoding row.
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    cases.push_back({"Attention_encoder_t5_bidirectional_ragged_40_9_70" + dtype_suffix(dtype),
                     dtype,
                     {check},
                     [](Gen& g) {
                       return encoder_scenario(g, t5_encoder(), {40, 9, 70});
                     }});
  // head_dim 64: in fp16/bf16 prompts take a GPU's tensor-core kernel (64 query rows and 64 keys
  // a tile): partial query and key tiles, ragged sequences, a second prompt chunk over keys
  // already cached, then decode steps (row kernel) reading the K/V the tiled kernel stored.
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    cases.push_back({"Attention_encoder_t5_dh64_ragged_130_9_70" + dtype_suffix(dtype),
                     dtype,
                     {check},
                     [](Gen& g) {
                       AttnConfig c = t5_encoder();
                       c.heads = 2;
                       c.head_dim = 64;
                       c.buckets = 32;
                       c.max_distance = 128;
                       return encoder_scenario(g, c, {130, 9, 70});
                     }});
    cases.push_back(
        {"Attention_cached_alibi_packed_dh64_chunked_prompts" + dtype_suffix(dtype),
         dtype,
         {check},
         [](Gen& g) {
           AttnConfig c = alibi_cached_packed();
           c.heads = 3;
           c.head_dim = 64;
           c.block_size = 16;
           return cached_scenario(
               g, c, {{{}, {{0, 70}, {1, 20}}}, {{}, {{1, 50}, {0, 40}}}, {{}, {{0, 1}, {1, 1}}}});
         }});
    cases.push_back({"Attention_cached_t5_dh64_chunked_prompts_block4" + dtype_suffix(dtype),
                     dtype,
                     {check},
                     [](Gen& g) {
                       AttnConfig c = t5_cached();
                       c.heads = 2;
                       c.head_dim = 64;
                       c.block_size = 4;
                       return cached_scenario(
                           g, c,
                           {{{}, {{0, 100}}}, {{}, {{0, 30}, {1, 65}}}, {{}, {{1, 1}, {0, 1}}}});
                     }});
  }
  // The CPU's AVX-512 loops at BLOOM's head shape (whole 16-lane chunks of a 64-wide head) and
  // at an odd one (20 = a chunk and a 4-lane remainder): batched decode over ragged histories,
  // the batch order changing between steps.
  for (DType dtype : {DType::kF32, DType::kBF16})
    cases.push_back(
        {"Attention_cached_alibi_packed_16heads_dh64_ragged_decode" + dtype_suffix(dtype),
         dtype,
         {check},
         [](Gen& g) {
           AttnConfig c = alibi_cached_packed();
           c.heads = 16;
           c.head_dim = 64;
           c.block_size = 16;
           return cached_scenario(g, c,
                                  {{{}, {{0, 37}, {1, 5}, {2, 20}}},
                                   {{}, {{2, 1}, {0, 1}, {1, 1}}},
                                   {{}, {{0, 1}, {1, 1}, {2, 1}}},
                                   {{}, {{1, 1}, {2, 1}, {0, 1}}}});
         }});
  // Many sequences: 24 x 16 heads = 384 (row, head) blocks, more than two an SM on the H200's
  // 132, the shape of batch-64 decode for the CUDA warp kernel (its 2-warp blocks).
  cases.push_back(
      {"Attention_cached_alibi_16heads_dh64_24seqs_decode_bf16", DType::kBF16, {check}, [](Gen& g) {
         AttnConfig c = alibi_cached_packed();
         c.heads = 16;
         c.head_dim = 64;
         c.block_size = 16;
         CachedStep prefill, decode, reversed;
         for (int s = 0; s < 24; ++s) {
           prefill.run.push_back({s, 1 + (s * 7) % 45});
           decode.run.push_back({s, 1});
           reversed.run.push_back({23 - s, 1});
         }
         return cached_scenario(g, c, {prefill, decode, reversed});
       }});
  cases.push_back(
      {"Attention_cached_t5_5heads_dh20_ragged_decode", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c = t5_cached();
         c.heads = 5;
         c.head_dim = 20;
         c.block_size = 4;
         return cached_scenario(
             g, c, {{{}, {{0, 9}, {1, 14}}}, {{}, {{0, 1}, {1, 1}}}, {{}, {{1, 1}, {0, 1}}}});
       }});
  cases.push_back(
      {"Attention_encoder_t5_5heads_dh20_ragged_9_33", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c = t5_encoder();
         c.heads = 5;
         c.head_dim = 20;
         return encoder_scenario(g, c, {9, 33});
       }});
  cases.push_back(
      {"Attention_cached_t5_chunked_long_prompts_block4", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c = t5_cached();
         c.block_size = 4;
         return cached_scenario(
             g, c, {{{}, {{0, 20}}}, {{}, {{0, 17}, {1, 30}}}, {{}, {{1, 1}, {0, 1}}}});
       }});
  // Decode over long contexts, where a GPU splits each (row, head) along the keys and joins the
  // shares: one sequence of 1500 positions (prefilled in two chunks), then single tokens; a
  // second sequence joins mid-way. fp32 sums over 1500 keys: 3e-5 of the largest output.
  const Check long_sums{CheckKind::kMaxRelative, 3e-5};
  for (DType dtype : {DType::kF32, DType::kF16})
    cases.push_back({"Attention_cached_alibi_long_context_decode" + dtype_suffix(dtype),
                     dtype,
                     {dtype == DType::kF32 ? long_sums : check},
                     [](Gen& g) {
                       return cached_scenario(g, alibi_cached_packed(),
                                              {{{}, {{0, 800}}},
                                               {{}, {{0, 700}}},
                                               {{}, {{0, 1}}},
                                               {{}, {{0, 1}, {1, 300}}},
                                               {{}, {{1, 1}, {0, 1}}}});
                     }});
  cases.push_back({"Attention_cached_t5_long_context_decode", DType::kF32, {check}, [](Gen& g) {
                     return cached_scenario(g, t5_cached(),
                                            {{{}, {{0, 1100}}}, {{}, {{0, 1}}}, {{}, {{0, 1}}}});
                   }});
  cases.push_back({"Attention_cross_long_encoder_decode", DType::kF32, {check}, [](Gen& g) {
                     AttnConfig c;
                     c.kind = AttentionKind::kCross;
                     c.scale = 0.7f;
                     return cross_scenario(g, c, {1200}, {1}, {3});
                   }});
  for (DType dtype : {DType::kF32, DType::kF16})
    cases.push_back(
        {"Attention_cross_layer1_ragged" + dtype_suffix(dtype), dtype, {check}, [](Gen& g) {
           AttnConfig c;
           c.kind = AttentionKind::kCross;
           c.scale = 0.7f;
           return cross_scenario(g, c, {5, 2}, {3, 1}, {0, 4});
         }});
  return cases;
}

namespace {

// The reference's paged path against its dense one: every output row of a cached run (forks,
// copy-on-write and chunking included) equals causal self attention over that sequence's whole
// history, bit for bit (the same keys in the same order give the same sums).
TEST(BackendOps, ReferencePagedAttentionEqualsWholeSequence) {
  struct Config {
    AttnConfig c;
    std::vector<CachedStep> steps;
  };
  AttnConfig t5_block4 = t5_cached();
  t5_block4.block_size = 4;
  const std::unique_ptr<Backend> reference = reference_backend();
  for (const Config& cfg :
       {Config{alibi_cached_packed(), kSharedPrefix}, Config{t5_block4, kChunkedPrefill},
        Config{alibi_cached_packed(), kPrefillThenDecode}}) {
    Gen g(DType::kF32, DType::kF32, 7);
    History h;
    const ScenarioOutputs cached =
        run_scenario(*reference, cached_scenario(g, cfg.c, cfg.steps, &h));
    AttnConfig dense = cfg.c;
    dense.kind = AttentionKind::kEncoderSelf;
    dense.packed = false;
    const int64_t W = cfg.c.width();
    for (size_t s = 0; s < h.q.size(); ++s) {
      Gen same_table(DType::kF32, DType::kF32, 7);  // the cached graph's table comes first
      Scenario whole = encoder_scenario(same_table, dense, {int64_t(h.q[s].size()) / W});
      whole.steps[0].feed = qkv_feed(g, dense, h.q[s], h.k[s], h.v[s]);
      const Tensor y = run_scenario(*reference, whole)[0][0];
      for (const Placement& p : h.placements) {
        if (p.seq != static_cast<int>(s)) continue;
        expect_matches(cached[p.step][0].slice_rows(p.row, p.row + p.tokens).clone(),
                       y.slice_rows(p.pos, p.pos + p.tokens).clone(), Check{CheckKind::kExact},
                       fmt::format("sequence {} positions {}..{}", s, p.pos, p.pos + p.tokens));
      }
    }
  }
}

// x -> Linear (packed qkv) -> cached ALiBi attention -> Linear, BLOOM-like, H heads of dh, a
// KV cache of `cache` rows in blocks of `block_size`: a prefill of `lengths` then `decode_steps`
// single tokens. Sequence 1's outputs are bitwise the same alone, in a batch, and in a batch of
// another order, on every backend that promises it (the CPU's: alone, a prompt's heads are
// split across the threads and a decode row's two halves of keys are computed by two threads
// and joined after; in a batch each thread takes whole sequences and joins the halves itself).
// Returns how many backends were checked.
int expect_batch_invariant(int H, int dh, int block_size, DType cache,
                           const std::vector<int64_t>& lengths, int decode_steps) {
  const int W = H * dh;
  Gen g(DType::kF32, DType::kF32, 11);
  AttnConfig c = alibi_cached_packed();
  c.heads = H;
  c.head_dim = dh;
  c.layer = 0;
  GraphBuilder b("block");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(W)});
  const int qkv = b.linear(x, b.weight("w_qkv", g.random({3 * W, W}, -0.3f, 0.3f)),
                           b.weight("b_qkv", g.random({3 * W})), "qkv");
  const int attn = b.attention(qkv, -1, -1, -1, attrs_of(c), "attn");
  b.output(b.linear(attn, b.weight("w_o", g.random({W, W})), -1, "o"), "y");
  Graph graph = b.finish();
  int64_t most_tokens = 0;
  for (int64_t len : lengths) most_tokens += len;
  plan_memory(graph, Logger(LogLevel::kError), {{"tokens", most_tokens}});

  std::vector<std::vector<float>> xs;  // sequence 1 is the one checked
  for (int64_t len : lengths) xs.push_back(g.floats((len + decode_steps) * W, -2, 2));
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    if (!nb.batch_invariant) continue;
    std::unique_ptr<Executable> exe = nb.backend->compile(graph, test_profile());
    // Prefill, then the decode steps, of the given sequences; returns sequence 1's outputs.
    auto run_sequences = [&](const std::vector<size_t>& which) {
      auto storage = nb.backend->create_kv_storage({1, W, block_size, cache});
      BlockManager blocks(*storage);
      std::vector<SequenceKv> kv(lengths.size());
      std::vector<float> result;
      for (int step = 0; step <= decode_steps; ++step) {
        StepLayout layout;
        layout.clear();
        std::vector<float> in;
        int64_t begin = 0, mine = -1, my_len = 0;
        for (size_t s : which) {
          const int64_t len = step == 0 ? lengths[s] : 1, past = kv[s].length();
          kv[s].prepare_append(blocks, len, &layout.copies);
          layout.add_sequence(len, past, kv[s].blocks(), nullptr);
          in.insert(in.end(), xs[s].begin() + past * W, xs[s].begin() + (past + len) * W);
          if (s == 1) mine = begin, my_len = len;
          begin += len;
        }
        const StepContext ctx{&layout, storage.get()};
        const std::vector<Tensor> feed = {Tensor::from_vector(in, {begin, W})};
        const Tensor& y = exe->execute(feed, &ctx)[0];
        result.insert(result.end(), y.data<float>() + mine * W,
                      y.data<float>() + (mine + my_len) * W);
        for (size_t s : which) kv[s].commit(step == 0 ? lengths[s] : 1);
      }
      for (SequenceKv& k : kv) k.release(blocks);
      return result;
    };
    const std::vector<float> alone = run_sequences({1});
    const std::vector<float> batched = run_sequences({0, 1, 2});
    const std::vector<float> reordered = run_sequences({2, 1, 0});
    const std::string where =
        fmt::format("{}: {} heads of {}, {} cache", nb.name, H, dh, dtype_name(cache));
    EXPECT_EQ(alone.size(), static_cast<size_t>((lengths[1] + decode_steps) * W)) << where;
    EXPECT_EQ(batched.size(), alone.size()) << where;
    EXPECT_EQ(reordered.size(), alone.size()) << where;
    if (batched.size() != alone.size() || reordered.size() != alone.size()) continue;
    EXPECT_EQ(std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)), 0) << where;
    EXPECT_EQ(std::memcmp(alone.data(), reordered.data(), alone.size() * sizeof(float)), 0)
        << where;
    ++checked;
  }
  return checked;
}

TEST(BackendOps, BatchedResultsAreBitwiseIdenticalToAlone) {
  EXPECT_GT(expect_batch_invariant(4, 4, 2, DType::kF32, {3, 5, 7}, 1), 0)
      << "the CPU backend promises batch invariance";
}

// BLOOM's head shape (16 x 64: whole 16-lane chunks) and an odd one (5 x 20: a chunk and a
// 4-lane remainder), f32 and bf16 caches, prompts over several blocks and decode steps across
// a block boundary.
TEST(BackendOps, BatchedDecodeIsBitwiseIdenticalToAloneAtModelShapes) {
  for (DType cache : {DType::kF32, DType::kBF16}) {
    EXPECT_GT(expect_batch_invariant(16, 64, 16, cache, {3, 40, 17}, 3), 0);
    EXPECT_GT(expect_batch_invariant(5, 20, 4, cache, {9, 33, 2}, 4), 0);
  }
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
        if (name == "q") continue;
        t = t.clone();
        float* x = t.data<float>();
        const int64_t cols = t.dim(1);
        for (int64_t i = 0; i < t.numel(); ++i)
          if (name != "qkv" || i % cols >= W) x[i] = bf16_to_float(float_to_bf16(x[i]));
      }
    const ScenarioOutputs want = run_scenario(*reference, rounded);
    for (NamedBackend& nb : available_backends()) {
      if (nb.backend->device() != Device::kCpu) continue;
      const ScenarioOutputs got = run_scenario(*nb.backend, bf16);
      for (size_t s = 0; s < got.size(); ++s)
        expect_matches(got[s][0], want[s][0], Check{CheckKind::kMaxRelative, 1e-5},
                       fmt::format("{} step {}", nb.name, s));
      ++checked;
    }
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
        for (Tensor* t : {&rounded.cross[i].keys[l], &rounded.cross[i].values[l]}) {
          *t = t->clone();
          float* x = t->data<float>();
          for (int64_t e = 0; e < t->numel(); ++e) x[e] = bf16_to_float(float_to_bf16(x[e]));
        }
      }
    }
    const ScenarioOutputs want = run_scenario(*reference, rounded);
    for (NamedBackend& nb : available_backends()) {
      if (nb.backend->device() != Device::kCpu) continue;
      const ScenarioOutputs got = run_scenario(*nb.backend, bf16);
      for (size_t s = 0; s < got.size(); ++s)
        expect_matches(got[s][0], want[s][0], Check{CheckKind::kMaxRelative, 1e-5},
                       fmt::format("{} head_dim {} step {}", nb.name, head_dim, s));
      ++checked;
    }
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
  const auto error_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
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
            }).find("rounds host f32 rows to bf16"),
            std::string::npos);
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
      be.argmax_rows(y[0], ids, {}, {});
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
