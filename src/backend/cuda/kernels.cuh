// Launchers of kiln's own CUDA kernels. This header is shared by the .cu files (nvcc, C++17) and
// the backend's C++20 sources, so it includes no other kiln header: tensors cross it as raw
// device pointers with their element types. Every launcher enqueues on `stream` and returns;
// kernels that can meet bad data (token ids, rows, block tables) record it in the DeviceStatus
// instead of reading out of bounds, and the executor turns it into a kiln::Error after the step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

enum class FloatType : int { kF32, kF16, kBF16 };
enum class IndexType : int { kI32, kI64 };
// The same functions as kiln::Activation, in its order.
enum class ActFn : int { kRelu, kGeluTanh, kGeluExact, kSilu };
enum class BinaryOp : int { kAdd, kMul };

// What a kernel found wrong; the first error wins.
enum StatusCode : int {
  kStatusOk = 0,
  kStatusTokenId = 1,
  kStatusGatherRow = 2,
  kStatusKvBlock = 3
};
struct DeviceStatus {
  int code;
  int node;         // index of the node in its graph
  long long value;  // the offending id / row / block
  long long limit;  // the bound it broke
};

// The stream kiln's kernels go to, with the launch policy of the CUDA context that owns it
// (device_types.cuh's launch()): `programmatic` allows programmatic dependent launch (sm_90+,
// unless KILN_CUDA_PDL=0), and `after_library` is the context's note that a kernel of another
// library (cuBLASLt) was just enqueued: the next kiln kernel is then launched plainly and starts
// only once that kernel has finished (such a kernel may let its dependents start early, and
// blocks of ours waiting on the SMs would take the room its later waves need). A bare
// cudaStream_t converts to plain launches.
struct KernelStream {
  cudaStream_t stream = nullptr;
  bool programmatic = false;
  bool* after_library = nullptr;
  int64_t* launches = nullptr;  // counts the kernels launched (LaunchStream::layout_visible)
  KernelStream() = default;
  KernelStream(cudaStream_t s) : stream(s) {}  // NOLINT(google-explicit-constructor)
  KernelStream(cudaStream_t s, bool pdl, bool* after, int64_t* count = nullptr)
      : stream(s), programmatic(pdl), after_library(after), launches(count) {}
};

// table [vocab, d], ids [n] -> out [n, d]
void launch_embedding(FloatType t, const void* table, int64_t vocab, int64_t d, IndexType it,
                      const void* ids, int64_t n, void* out, DeviceStatus* status, int node,
                      KernelStream stream);
// table i8 [vocab, d] with f32 scales [vocab], ids [n] -> out f32 [n, d] = table[id] · scale[id]
void launch_embedding_i8(const int8_t* table, const float* scales, int64_t vocab, int64_t d,
                         IndexType it, const void* ids, int64_t n, float* out, DeviceStatus* status,
                         int node, KernelStream stream);
// x [rows_in, d], rows [r] -> out [r, d]
void launch_gather_rows(FloatType t, const void* x, int64_t rows_in, int64_t d, IndexType it,
                        const void* rows, int64_t r, void* out, DeviceStatus* status, int node,
                        KernelStream stream);
// y = a op b, n elements
void launch_binary(BinaryOp op, FloatType t, const void* a, const void* b, void* y, int64_t n,
                   KernelStream stream);
// y = x * s
void launch_scale(FloatType t, const void* x, float s, void* y, int64_t n, KernelStream stream);
// y = x converted (round to nearest even)
// dst[i][0, bytes) = src[i][0, bytes) for every part (parts in device memory): one launch.
struct CopyPart {
  const void* src;
  void* dst;
  long long bytes;
};
void launch_copy_parts(const CopyPart* parts, int64_t count, KernelStream stream);
// A step's uploads (its layout and inputs) as one kernel, the parts passed by value: dst[0,
// bytes) = src[0, bytes) for each. `host` parts read pinned host memory (addressable from the
// GPU under unified addressing) that nothing on the GPU writes: they are read before the wait for
// the kernel before this one, uncached (the host rewrites them between steps); the others are
// device memory read after that wait. Between two decode steps a kernel costs less than a copy
// in the stream, and one replaces several.
struct UploadPart {
  const void* src;
  void* dst;
  long long bytes;
  bool host;
};
struct UploadList {
  static constexpr int kMax = 8;
  static constexpr long long kMaxBytes = 64 << 10;  // more goes by cudaMemcpyAsync (CudaContext)
  int count = 0;
  UploadPart part[kMax];
};
void launch_uploads(const UploadList& list, KernelStream stream);
// *host = *status, host in pinned host memory: a step's status word for the host's check
// without a copy in the stream.
void launch_publish_status(const DeviceStatus* status, DeviceStatus* host, KernelStream stream);
void launch_cast(FloatType from, FloatType to, const void* x, void* y, int64_t n,
                 KernelStream stream);
// y = act(x) (y may be x)
void launch_activation(ActFn act, FloatType t, const void* x, void* y, int64_t n,
                       KernelStream stream);
// y[r, c] = act(round(y[r, c] + bias[c])) for a [rows, cols] linear output (in place);
// has_act false: bias only. bias may be null (activation only).
void launch_bias_activation(FloatType t, void* y, FloatType bias_t, const void* bias, int64_t rows,
                            int64_t cols, bool has_act, ActFn act, KernelStream stream);
// Rows a kernel gathers from its input (a LayerNorm of embedding rows, the lm_head's GEMV): row r
// of the output is computed from row index[r] of x, which has table_rows rows; an index out of
// range is reported (a norm: a bad token id; the GEMV: a bad row) and never read.
struct RowIndex {
  const void* index = nullptr;  // null: row r is x's row r
  IndexType type = IndexType::kI64;
  int64_t table_rows = 0;
  DeviceStatus* status = nullptr;
  int node = -1;
};
// The few-row Linear of decode steps (gemv.cu): y [rows, out] = act(round(x [rows, in] · w [out,
// in]^T + bias)) (+ residual [rows, out], rounded again, when not null), rows <= kGemvMaxRows,
// fp32 accumulation, weights streamed with 16-byte loads.
// gemv_fits says whether the operands allow it (rows of whole 16-byte chunks, aligned);
// gemv_split how many warps share a feature's row so that `out` features fill `sms` SMs with
// about `warps_per_sm` warps each.
inline constexpr int kGemvMaxRows = 8;
// Without a tactic (plans built with --no-tune, or row counts no tactic covers) a Linear of up
// to this many rows runs on the GEMV, 6-8 on cuBLASLt (9-32 on the skinny GEMM, below, where it
// applies). The GEMV's cost grows with its rows
// (each row's sums in registers: fewer blocks an SM; at 6 rows one block). On the H200, untuned
// decode steps at batch 4 / 5 / 6 / 8 took 0.95 / 1.07 / 1.65 / 2.06 ms on the GEMV (8 warps an SM
// from two rows, gemv_warps_per_sm) and 1.16 / 1.13 / 1.15 / 1.11 on cuBLASLt (bloom-560m;
// flan-t5-large 1.18 / 1.32 / 1.79 / 2.31 against 1.43 / 1.50 / 1.53 / 1.30;
// bench/gpu/h200-2026-12-01w-gemv-warps-rows-ab.log, -01w-gemv-rows-5-6.log). Tuned plans time
// both (and the skinny GEMM) at 1, 2, 3, 4, 5 and 8 rows.
inline constexpr int kGemvDefaultRows = 5;
bool gemv_fits(FloatType t, const void* x, const void* w, int64_t in);
int gemv_split(FloatType t, int64_t in, int64_t out, int sms, int warps_per_sm);
// The blocks of the wide one-row instance (GemvParams::wide) for this shape.
int64_t gemv_wide_blocks(FloatType t, int64_t in, int64_t out);
struct GemvParams {
  FloatType type;
  const void* x;
  const void* w;
  FloatType bias_type;
  const void* bias;
  const void* residual;
  void* y;
  int64_t rows, in, out;
  int split;
  bool has_act;
  ActFn act;
  // A folded input norm: y = rstd * (x · w^T - mean * row_sums) + bias, the row's mean and rstd
  // from its own sums; RMSNorm (null row sums): y = x · w^T / rms + bias. One row, a bias of the
  // activations' type (or none). norm_scale (f32 [in], 16-byte aligned, or null): gamma of a
  // norm whose weight stays unfolded, x · w^T then being (x * gamma) · w^T.
  bool norm = false;
  const void* norm_row_sums = nullptr;  // f32 [out]
  const float* norm_scale = nullptr;
  // Not null: y is not written; y32 [rows, out] gets each output rounded to `type`, as f32 (a
  // widened Linear, fuse_linear_cast). No residual.
  float* y32 = nullptr;
  // x's row x_rows.index[0] instead of row 0 (fuse_gather_linear: the lm_head of a decode step);
  // one row with a folded norm only (launch_gemv is false otherwise).
  RowIndex x_rows;
  float norm_eps = 0.0f;
  // One row, no gathered row, no norm scale (ignored otherwise): fewer, larger blocks whose
  // warps load every weight they multiply before waiting for the kernel before them (4 chunk
  // positions a lane and the smallest split that covers the row; rows longer than 1024 chunks
  // take more passes).
  bool wide = false;
};
// False, launching nothing, when p asks for a folded norm it cannot take (see norm).
bool launch_gemv(const GemvParams& p, KernelStream stream);
// The Linear of int8-weight plans (gemv_i8.cu): y [rows, out] = act(round((x [rows, in] ·
// q [out, in]^T) · scales[o] + bias)) (+ residual [rows, out], rounded again), x, y and the
// residual of `type` (any float type), q int8, scales f32 [out], bias of bias_type or null; any
// number of rows (slices of 8 in the grid). With group_scales (int4-weight plans): q int4 (two a
// byte) and each group of 128 inputs times its f16 scale [out, in / 128] instead of scales.
// gemv_i8_fits: `in` a multiple of 8 (int4: 16), x 16-byte and q 8-byte aligned.
bool gemv_i8_fits(const void* x, const void* w, int64_t in, bool i4 = false);
// The warps of the int8 (int4) GEMV an SM holds at once (its registers decide), at one row or
// more.
int gemv_i8_warps_per_sm(FloatType t, int64_t rows, bool i4 = false);
inline constexpr int kI8GemvMaxRows = 64;
inline constexpr int kI8GemvDefaultRows = 8;
// The most rows a W8A8 / fp8 Linear may run on its GEMV (gemv_w8a8.cu's slices of 8), and the
// default (KILN_CUDA_W8A8_GEMV_ROWS): more rows take cuBLASLt's int8 / FP8 GEMM.
inline constexpr int kW8a8GemvMaxRows = 32;
inline constexpr int kW8a8GemvDefaultRows = 8;
struct GemvI8Params {
  FloatType type;
  const void* x;
  const void* w;                       // int8 [out, in], or int4 with group_scales
  const float* scales;                 // f32 [out] (int8)
  const void* group_scales = nullptr;  // f16 [out, in / 128]: w is int4
  FloatType bias_type;
  const void* bias;
  const void* residual;
  void* y;
  // Not null: y is not written; y32 gets each output rounded to `type`, as f32. No residual.
  float* y32 = nullptr;
  int64_t rows, in, out;
  int split;  // warps a feature group (gemv_split of an fp16 Linear of the same shape, sized
              // to gemv_i8_warps_per_sm)
  bool has_act = false;
  ActFn act = ActFn::kRelu;
  // A folded input norm (one row): LayerNorm with norm_row_sums (f32 [out], of q · gamma),
  // RMSNorm without; norm_scale: gamma (f32 [in], 16-byte aligned; null: 1).
  bool norm = false;
  const float* norm_row_sums = nullptr;
  const float* norm_scale = nullptr;
  float norm_eps = 0.0f;
};
// False, launching nothing, for a folded norm on more than one row (or a misaligned gamma).
bool launch_gemv_i8(const GemvI8Params& p, KernelStream stream);
// w [rows, in] (of float type t, 16-byte aligned) = q [rows, in] · scales[row], rounded to t;
// `in` a multiple of 8.
void launch_dequantize_i8(FloatType t, const int8_t* q, const float* scales, void* w, int64_t rows,
                          int64_t in, KernelStream stream);
// The same for int4 q [rows, in] (8-byte aligned, `in` a multiple of 16) with f16 group scales
// [rows, in / 128]: w = round(q · scale[row][i / 128]).
void launch_dequantize_i4(FloatType t, const void* q, const void* scales, void* w, int64_t rows,
                          int64_t in, KernelStream stream);
// W8A8 and fp8 Linears (gemv_w8a8.cu): x [rows, in] quantized to int8 (fp8: E4M3) with its static
// scale as graph/linear.h defines it, int8 (E4M3) weights w [out, in] with f32 per-channel
// scales, int32 (f32) sums,
// y = act(round(Σ · x_scale · scales[o] + bias)) (+ residual, rounded again), or y32 (a widened
// Linear: each output rounded to `type`, as f32; no residual). The GEMV runs decode steps (any
// rows, slices of 8; `in` a multiple of 8, x 16-byte and w 8-byte aligned: gemv_w8a8_fits).
// How rows of y are stored, by the GEMV and the GEMM's epilogue alike (`residual`, `y` and `y32`
// point at the first of the `rows` rows).
struct W8a8Store {
  FloatType type;
  const float* scales;
  float x_scale;  // s
  FloatType bias_type;
  const void* bias;
  const void* residual;
  void* y;
  float* y32 = nullptr;
  int64_t rows, out;
  bool has_act = false;
  ActFn act = ActFn::kRelu;
};
struct GemvW8a8Params {
  W8a8Store store;
  const void* x;
  const void* w;  // int8 (fp8: E4M3) [out, in]
  bool fp8 = false;
  float inv_scale;  // input_inv_scale(s)
  int64_t in;
  int split;  // warps a feature group (gemv_split, sized to gemv_w8a8_warps_per_sm)
};
void launch_gemv_w8a8(const GemvW8a8Params& p, KernelStream stream);
bool gemv_w8a8_fits(const void* x, const void* w, int64_t in);
// Warps an SM holds at once of the GEMV at `rows` rows (1, or slices of 8).
int gemv_w8a8_warps_per_sm(FloatType t, int64_t rows, bool fp8);
// q [n] = quantize_input(x [n]) (fp8: quantize_input_fp8's E4M3 codes) (n a multiple of 4, q
// 4-byte aligned).
void launch_quantize_rows(FloatType t, bool fp8, const void* x, float inv_scale, void* q, int64_t n,
                          KernelStream stream);
// y [rows, out] from the GEMM's sums acc [rows, out] (int8: int32; float_acc, fp8: f32), as the
// GEMV stores.
struct W8a8EpilogueParams {
  W8a8Store store;
  const void* acc;
  bool float_acc = false;
};
void launch_w8a8_epilogue(const W8a8EpilogueParams& p, KernelStream stream);
// The Linear of batched decode steps on tensor cores (skinny_gemm.cu): y [rows, out] =
// act(round(x [rows, in] · w [out, in]^T + bias)) (+ residual [rows, out], rounded again, when
// not null), fp16 or bf16 with fp32 accumulation, rows <= kSkinnyMaxRows; its first weights
// stream before its programmatic-launch wait. skinny_fits says whether the operands allow it
// (fp16/bf16, `in` a multiple of 32, 16-byte aligned x and w).
inline constexpr int kSkinnyMaxRows = 32;
inline constexpr int kSkinnyDefaultRows = 32;
struct SkinnyParams {
  FloatType type;
  const void* x;
  const void* w;
  const void* bias;      // of `type`, or null
  const void* residual;  // or null
  void* y;
  // Not null: y is not written; y32 [rows, out] gets each output rounded to `type`, as f32 (a
  // widened Linear). No residual.
  float* y32 = nullptr;
  int64_t rows, in, out;
  bool has_act = false;
  ActFn act = ActFn::kRelu;
  RowIndex x_rows;  // x's rows x_rows.index[r] instead of rows r (no residual)
  int sms = 1;      // the GPU's multiprocessors (the grid's size)
  // Not null: w is int8 [out, in] (8-byte aligned) and each feature's sum is multiplied by its
  // f32 scale before the bias (int8-weight plans).
  const float* scales = nullptr;
  // Not null: w is int4 [out, in] (two a byte, 4-byte aligned) with these f16 scales [out,
  // in / 128], each weight widened times its group's scale (int4-weight plans).
  const void* group_scales = nullptr;
};
bool skinny_fits(FloatType t, const void* x, const void* w, int64_t in, int64_t rows,
                 bool i8 = false, bool i4 = false);
void launch_skinny(const SkinnyParams& p, KernelStream stream);
// y [rows, cols] = round(act(gate)) * up, gate's and up's rows `ld` elements apart (cols for
// two inputs; 2 * cols for a packed gate | up, up = gate + cols)
void launch_gated(ActFn act, FloatType t, const void* gate, const void* up, void* y, int64_t rows,
                  int64_t cols, int64_t ld, KernelStream stream);

// x [rows, d], w [d] -> y [rows, d]
void launch_rms_norm(FloatType t, FloatType wt, const void* x, const void* w, void* y, int64_t rows,
                     int64_t d, float eps, KernelStream stream);
// x [rows, d] (gathered: [table_rows, d]), w [d], b [d] -> y [rows, d]
void launch_layer_norm(FloatType t, FloatType wt, const void* x, const void* w, const void* b,
                       void* y, int64_t rows, int64_t d, float eps, KernelStream stream,
                       const RowIndex& gather = {});
// a, b [rows, d], w [d] -> sum = a + b (rounded), y = rmsnorm(sum) * w
void launch_add_rms_norm(FloatType t, FloatType wt, const void* a, const void* b, const void* w,
                         void* sum, void* y, int64_t rows, int64_t d, float eps,
                         KernelStream stream);
// x [rows, d] -> softmax over d in fp32
void launch_softmax(FloatType t, const void* x, void* y, int64_t rows, int64_t d,
                    KernelStream stream);

// The step's layout in device memory (uploaded once per step by the executor).
struct DeviceStep {
  int num_seqs;
  int max_blocks;
  const int* token_begin;      // [seqs + 1]
  const int* past_len;         // [seqs]
  const int* token_seq;        // [tokens]: the sequence of each row
  const int* block_table;      // [seqs, max_blocks]
  const int* cross_len;        // [seqs]
  int cross_layers;            // width of the cross pointer tables
  const void* const* cross_k;  // [seqs, cross_layers]
  const void* const* cross_v;  // [seqs, cross_layers]
};

// The paged KV storage as kernels see it: a block b holds, per layer, block_size key rows then
// block_size value rows of row_width elements; block_base[b] is its first byte.
struct DeviceKv {
  char* const* block_base;  // [capacity]
  int64_t capacity;
  int block_size;
  int64_t row_width;
  int64_t layer_bytes;  // bytes of one layer's keys (or values) in a block
  // Keys and values stored as E4M3 (--kv-cache fp8, scale 1: saturating at ±448, rounded to
  // nearest even), which the attention widens as it reads them; otherwise in its own type.
  bool fp8;
};

enum class AttnKind : int { kEncoderSelf, kCachedSelf, kCross };
// kAuto: prompts that fill the GPU; kAlways: any step the kernel can take; kOff: none.
enum class TiledAttention : int { kOff, kAuto, kAlways };
enum class AttnBias : int { kNone, kT5Relative, kAlibi };

struct AttentionParams {
  AttnKind kind;
  AttnBias bias;
  int layer;
  int heads;
  int head_dim;
  bool causal;
  float scale;
  FloatType act;  // q, k, v, y (and cross K/V)
  const void* q;
  const void* k;
  const void* v;
  int64_t q_stride;   // elements per row of q
  int64_t kv_stride;  // elements per row of k and v
  void* y;            // [tokens, heads * head_dim]
  int64_t tokens;
  // T5: table [buckets, heads] and the bucket of each distance (bucket_of[n], n < bucket_len
  // covers every distance; larger distances use the last entry), one table for keys after the
  // query and one for keys before it.
  const void* rel_table;
  FloatType table_type;
  const int* bucket_after;
  const int* bucket_before;
  int bucket_len;
  DeviceStep step;
  DeviceKv kv;
  DeviceStatus* status;
  int node;
  // Split-sequence decode: key_class = attention_key_class(the step's longest key count);
  // split_out holds split_capacity (row, head, split) partials of head_dim + 2 floats.
  int key_class;
  float* split_out;
  int64_t split_capacity;
  // When the tensor-core kernel (attention_tiled.cu) takes the step, and the step's longest
  // sequence (its rows), which sizes that kernel's grid.
  TiledAttention tiled;
  int64_t longest_seq;
  int tiled_rows;  // query rows per block of the tiled kernel: 32 or 64
  // Whether row-kernel steps may take the warp kernel (attention_warps.cu) where it fits.
  bool warp_rows;
  // Whether the step's layout (and the cache rows earlier steps wrote) are visible to this
  // kernel before its programmatic-launch wait: a kiln kernel ran between the step's uploads and
  // this one (LaunchStream::layout_visible). Otherwise the warp kernel waits before reading them.
  bool layout_visible;
  int sms;  // the GPU's multiprocessors (the warp kernel's block size follows the step's blocks)
  // The warp kernel's warps per block when the step has a block per SM or fewer: 0 (default)
  // the fewest of 8 and 16 that score key_bound keys in one pass; 16, 8 or 4 forced (A/B runs).
  int warps_forced;
  // The step's longest key count rounded up to kKeyBucketSize (a CUDA graph is captured per
  // bucket: StepUploads::step_key_bucket); above kMaxKeyBuckets buckets, more than that.
  int64_t key_bound;
};
// Decode attention over long contexts splits each (row, head) along its keys: shares of at
// least kSplitKeys keys, at most kMaxSplits of them, and only while the step's (row, head,
// split) blocks stay under kSplitBlocks (enough to fill the GPU).
inline constexpr int kSplitKeys = 256;
inline constexpr int kMaxSplits = 16;
inline constexpr int kSplitBlocks = 512;
// Buckets of the longest key count for the warp kernel's block size (key_bound).
inline constexpr int kKeyBucketSize = 64;
inline constexpr int kMaxKeyBuckets = 4;
inline int attention_key_bucket(int64_t longest_keys) {
  const int64_t b = (longest_keys + kKeyBucketSize - 1) / kKeyBucketSize;
  return static_cast<int>(b < kMaxKeyBuckets + 1 ? b : kMaxKeyBuckets + 1);
}
// Whether the warp kernel sizes the blocks of a step of `blocks` (row, head, split) blocks by
// key_bound: at a block per SM or fewer, unless the size is forced (warps_forced). The one rule
// for the launch (attention_warps.cu) and for the CUDA graph key, which then holds the bucket.
inline bool warps_follow_keys(int64_t blocks, int sms, int warps_forced) {
  return blocks <= sms && warps_forced == 0;
}
inline int attention_key_class(int64_t longest_keys) {
  int c = 0;
  while (c < 4 && (int64_t{kSplitKeys} << c) < longest_keys) ++c;
  return c;
}
// The splits launch_attention uses for a step (1: none).
int attention_splits(int64_t tokens, int heads, int key_class, int64_t capacity);
// Token ids greedy decoding may not pick in some rows (EOS before min_new_tokens).
struct BannedIds {
  static constexpr int kMax = 8;
  int count;
  long long id[kMax];
};
// Row flags by value, for steps of up to kRows rows: bit r of the mask is row r's flag.
struct RowMask {
  static constexpr int kRows = 512;
  unsigned long long bits[kRows / 64];
};
// out[r] = the first index of the largest value of row r of x [rows, cols] (greedy decoding:
// only token ids leave the GPU), skipping banned.id[] in the rows r whose flag is set: ban_row[r]
// non-zero (device memory), or, where ban_row is null, bit r of `mask` (no row bans: all zero).
// host_out (may be null): pinned host memory the kernel writes the ids to as well, so that the
// host needs no copy after it. scratch holds argmax_scratch_bytes(); row_done [rows] is zero
// before the first launch, and each launch leaves it zero. One kernel, no memset.
size_t argmax_scratch_bytes(int64_t rows, int64_t cols);
void launch_argmax_rows(FloatType t, const void* x, int64_t rows, int64_t cols,
                        const BannedIds& banned, const unsigned char* ban_row, const RowMask& mask,
                        void* scratch, unsigned int* row_done, long long* out, long long* host_out,
                        KernelStream stream);
// The k best columns of each row r of x [rows, cols] (select.cu), for sampling and beam search:
// values[r*k + j] = x[r][c] / temperature[r] (temperature null: no scaling) of the j-th best c,
// best first, ties to the lower column, with banned.id[] skipped where ban_row[r] is non-zero;
// columns[r*k + j] = c (-1 past the end of a row with fewer than k columns); and log_norm[r] =
// log(sum_c exp(x[r][c])) over every column, unscaled. scratch holds topk_scratch_bytes().
size_t topk_scratch_bytes(int64_t rows, int64_t cols, int k);
void launch_topk_rows(FloatType t, const void* x, int64_t rows, int64_t cols, int k,
                      const float* temperature, const BannedIds& banned,
                      const unsigned char* ban_row, void* scratch, float* values, int* columns,
                      float* log_norm, KernelStream stream);

// One row's logits processors for launch_edit_logits: its ids are ids[penalized, banned) to
// penalize, [banned, forced) to ban, [forced, suppressed) to force, [suppressed, end) to
// suppress (RowEdit's order and meaning).
struct LogitEdit {
  long long row;
  float penalty;
  int log_softmax;
  int penalized, banned, forced, suppressed, end;
};
// Applies edits[0, count) to the rows of x [rows, cols] (f32) in place (logit_edits.cu).
void launch_edit_logits(float* x, int64_t cols, const LogitEdit* edits, int count,
                        const long long* ids, KernelStream stream);

// Attends; cached self attention also stores this step's K/V rows in the cache (in the same
// kernel: its own keys it reads from the step's rows).
void launch_attention(const AttentionParams& p, KernelStream stream);
// Largest head_dim launch_attention handles.
inline constexpr int kMaxHeadDim = 256;

}  // namespace kiln::cuda
