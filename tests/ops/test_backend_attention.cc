// Attention in the op table (encoder self, cached self through the paged KV cache over several
// steps, cross), and the attention checks beside it: the reference's paged path against whole
// sequences and batch invariance of the fast backends (bf16 K/V and bad inputs:
// test_backend_attention_bf16_bad_input.cc).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>

#include "../models/graph_runner.h"
#include "attention_scenarios.h"
#include "backend_ops.h"
#include "core/half.h"
#include "passes/pass.h"
#include "runtime/kv_cache.h"

namespace kiln::test {

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
  // Head widths a multiple of 16: the CPU's AVX-512 register tiles for encoder prompts
  // (attention_prompt.cc): keys in tiles of 64, 48 (3 vectors), 32 and 16, query blocks of 6 and
  // what is left (1-5 rows), head widths of 1 to 4 vectors and two chunks (128); packed q/k/v as
  // flan-t5's; ALiBi and a scale; a causal encoder (the row-at-a-time loops).
  cases.push_back(
      {"Attention_encoder_t5_packed_dh64_ragged_78_5_1", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c = t5_encoder();
         c.heads = 3;
         c.head_dim = 64;
         c.buckets = 32;
         c.max_distance = 128;
         c.packed = true;
         return encoder_scenario(g, c, {78, 5, 1});
       }});
  cases.push_back(
      {"Attention_encoder_alibi_scaled_dh48_ragged_23_48", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c;
         c.bias = PositionBias::kAlibi;
         c.heads = 6;
         c.head_dim = 48;
         c.scale = 0.5f;
         return encoder_scenario(g, c, {23, 48});
       }});
  cases.push_back(
      {"Attention_encoder_nobias_dh128_ragged_33_2_17", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c;
         c.heads = 2;
         c.head_dim = 128;
         c.scale = 0.125f;
         return encoder_scenario(g, c, {33, 2, 17});
       }});
  cases.push_back({"Attention_encoder_nobias_dh16_ragged_64_7", DType::kF32, {check}, [](Gen& g) {
                     AttnConfig c;
                     c.heads = 4;
                     c.head_dim = 16;
                     return encoder_scenario(g, c, {64, 7});
                   }});
  cases.push_back(
      {"Attention_encoder_causal_t5_dh64_ragged_20_3", DType::kF32, {check}, [](Gen& g) {
         AttnConfig c = t5_encoder();
         c.heads = 2;
         c.head_dim = 64;
         c.buckets = 32;
         c.max_distance = 128;
         c.causal = true;
         return encoder_scenario(g, c, {20, 3});
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

}  // namespace
}  // namespace kiln::test
