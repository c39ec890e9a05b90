// Attention scenarios for the backend op tests: configurations (heads, bias, causal, packed
// q/k/v, KV block size), and the graphs, feeds, step layouts, KV caches and cross K/V of encoder,
// cached (several steps, beam forks, chunked prompts) and cross attention runs.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "runtime/kv_cache.h"

namespace kiln::test {

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
inline constexpr int kLayers = 2;

inline AttentionAttrs attrs_of(const AttnConfig& c) {
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
inline Graph attention_graph(Gen& g, const AttnConfig& c) {
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
inline std::map<std::string, Tensor> qkv_feed(const Gen& g, const AttnConfig& c,
                                              const std::vector<float>& q,
                                              const std::vector<float>& k,
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
inline Scenario encoder_scenario(Gen& g, const AttnConfig& c, const std::vector<int64_t>& lengths) {
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
inline Scenario cross_scenario(Gen& g, const AttnConfig& c, const std::vector<int64_t>& enc,
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

inline Scenario cached_scenario(Gen& g, const AttnConfig& c, const std::vector<CachedStep>& steps,
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

inline AttnConfig t5_encoder() {
  AttnConfig c;
  c.bias = PositionBias::kT5Relative;
  return c;
}
inline AttnConfig alibi_cached_packed() {  // BLOOM: 6 heads for the non-power-of-two slopes
  AttnConfig c;
  c.kind = AttentionKind::kCachedSelf;
  c.bias = PositionBias::kAlibi;
  c.heads = 6;
  c.causal = true;
  c.packed = true;
  c.scale = 0.5f;
  return c;
}
inline AttnConfig t5_cached() {  // T5 decoder: causal buckets, unscaled
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
inline const std::vector<CachedStep> kPrefillThenDecode = {
    {{}, {{0, 4}, {1, 3}}}, {{}, {{0, 1}, {1, 1}}}, {{}, {{1, 1}, {0, 1}}}};
// A prompt of 5 (its last block half full) forked into three beams that decode and fork again: a
// beam writing into a last block it still shares gets a copy of it first.
inline const std::vector<CachedStep> kSharedPrefix = {{{}, {{0, 5}}},
                                                      {{{1, 0}, {2, 0}}, {{0, 1}, {1, 1}, {2, 1}}},
                                                      {{}, {{2, 1}, {0, 1}, {1, 1}}},
                                                      {{{3, 1}}, {{3, 1}, {1, 1}}}};
// Chunked prefill beside decoding sequences, past max_distance (10) for the clamped bucket.
inline const std::vector<CachedStep> kChunkedPrefill = {
    {{}, {{0, 4}}}, {{}, {{0, 3}, {1, 5}}}, {{}, {{1, 7}, {0, 1}}}, {{}, {{0, 1}, {1, 1}}}};

}  // namespace kiln::test
