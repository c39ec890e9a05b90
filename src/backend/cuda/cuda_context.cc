#include "backend/cuda/cuda_context.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "backend/cuda/cublaslt_loader.h"
#include "backend/cuda_info.h"

namespace kiln::cuda {

void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // clear a sticky-free error so the next call starts clean
  KILN_FAIL("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err),
            call, file, line);
}

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "an unknown cuBLAS status";
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  KILN_FAIL("cuBLASLt error {} in {} at {}:{}", cublas_status_name(status), call, file, line);
}

FloatType float_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return FloatType::kF32;
    case DType::kF16:
      return FloatType::kF16;
    case DType::kBF16:
      return FloatType::kBF16;
    case DType::kI8:
    case DType::kI32:
    case DType::kI64:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      break;
  }
  KILN_FAIL("the cuda kernels take f32, f16 or bf16 tensors, not {}", dtype_name(dtype));
}

ActFn act_fn(Activation a) {
  switch (a) {
    case Activation::kRelu:
      return ActFn::kRelu;
    case Activation::kGeluTanh:
      return ActFn::kGeluTanh;
    case Activation::kGeluExact:
      return ActFn::kGeluExact;
    case Activation::kSilu:
      return ActFn::kSilu;
  }
  KILN_FAIL("unknown activation {}", static_cast<int>(a));
}

IndexType index_type(DType dtype) {
  switch (dtype) {
    case DType::kI32:
      return IndexType::kI32;
    case DType::kI64:
      return IndexType::kI64;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      break;
  }
  KILN_FAIL("the cuda kernels take i32 or i64 indices, not {}", dtype_name(dtype));
}

namespace {

// Device bytes that kiln's allocators hold (live blocks and their caches), and the most they held
// since cuda_memory_peak_reset(): the high-water mark between two readings of cudaMemGetInfo.
std::atomic<long long> g_held{0};
std::atomic<long long> g_peak_held{0};
// Of g_held: the libraries' fixed workspaces (cuBLASLt's, one per context).
std::atomic<long long> g_library_workspace{0};

void note_malloc(size_t bytes) {
  const long long held = g_held += static_cast<long long>(bytes);
  long long peak = g_peak_held.load();
  while (held > peak && !g_peak_held.compare_exchange_weak(peak, held)) {
  }
}

// The bytes a part of a copy_groups / copy_row_groups buffer takes: each starts 256-byte aligned.
size_t part_bytes(size_t bytes) { return (bytes + 255) / 256 * 256; }

void free_block(void* p, size_t bytes) {
  cudaFree(p);
  g_held -= static_cast<long long>(bytes);
}

}  // namespace

struct CudaAllocator::Cache {
  std::mutex mutex;
  std::multimap<size_t, void*> free;  // by block size
  size_t bytes = 0;
  ~Cache() { release(); }
  void release() {
    for (auto& [size, p] : free) free_block(p, size);
    free.clear();
    bytes = 0;
  }
};

CudaAllocator::CudaAllocator(cudaStream_t stream)
    : stream_(stream), cache_(std::make_shared<Cache>()) {}

size_t CudaAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(cache_->mutex);
  return cache_->bytes;
}

std::shared_ptr<void> CudaAllocator::allocate_raw(size_t bytes) {
  const size_t rounded = std::max<size_t>((bytes + 255) / 256 * 256, 256);
  std::shared_ptr<Cache> cache = cache_;
  void* p = nullptr;
  size_t size = rounded;
  {
    std::lock_guard<std::mutex> lock(cache->mutex);
    // The smallest cached block that fits, if it wastes at most half of itself.
    auto it = cache->free.lower_bound(rounded);
    if (it != cache->free.end() && it->first <= 2 * rounded) {
      size = it->first;
      p = it->second;
      cache->bytes -= size;
      cache->free.erase(it);
    }
  }
  if (p == nullptr) {
    cudaError_t err = cudaMalloc(&p, rounded);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      {
        std::lock_guard<std::mutex> lock(cache->mutex);
        cache->release();
      }
      err = cudaMalloc(&p, rounded);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      KILN_FAIL("out of GPU memory allocating {} bytes ({} of {} bytes free): {}", rounded,
                free_bytes, total, cudaGetErrorString(err));
    }
    note_malloc(rounded);
  }
  return std::shared_ptr<void>(p, [cache, size](void* q) {
    if (size <= kMaxCachedBlock) {
      std::lock_guard<std::mutex> lock(cache->mutex);
      if (cache->bytes + size <= kMaxCachedBytes) {
        cache->free.emplace(size, q);
        cache->bytes += size;
        return;
      }
    }
    free_block(q, size);
  });
}

std::shared_ptr<void> CudaAllocator::allocate(size_t bytes) {
  std::shared_ptr<void> p = allocate_in_order(bytes);
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return p;
}

std::shared_ptr<void> CudaAllocator::allocate_in_order(size_t bytes) {
  std::shared_ptr<void> p = allocate_raw(bytes);
  KILN_CUDA_CHECK(cudaMemsetAsync(p.get(), 0, std::max<size_t>(bytes, 1), stream_));
  return p;
}

Tensor CudaAllocator::upload(const Tensor& source) {
  KILN_CHECK(source.defined(), "cannot upload an undefined tensor to the GPU");
  const size_t bytes = source.nbytes();
  std::shared_ptr<void> memory = allocate_raw(std::max<size_t>(bytes, 1));
  Tensor t = Tensor::view(source.dtype(), source.shape(), memory.get(), memory, Device::kCuda);
  if (bytes > 0) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(t.raw(), source.raw(), bytes, cudaMemcpyDefault, stream_));
    // A host source may be freed when this returns; a device one is read in stream order.
    if (source.device() != Device::kCuda) KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  return t;
}

std::vector<std::vector<Tensor>> CudaAllocator::copy_groups(
    std::span<const std::vector<Tensor>> groups) {
  std::vector<std::vector<Tensor>> out(groups.size());
  std::vector<CopyPart> parts;
  for (size_t g = 0; g < groups.size(); ++g) {
    size_t total = 0;
    for (const Tensor& t : groups[g]) total += part_bytes(t.nbytes());
    std::shared_ptr<void> memory = allocate_raw(std::max<size_t>(total, 1));
    char* at = static_cast<char*>(memory.get());
    for (const Tensor& t : groups[g]) {
      KILN_CHECK(t.defined(), "cannot copy an undefined tensor on the GPU");
      Tensor copy = Tensor::view(t.dtype(), t.shape(), at, memory, Device::kCuda);
      if (t.device() != Device::kCuda) {
        KILN_CUDA_CHECK(cudaMemcpyAsync(at, t.raw(), t.nbytes(), cudaMemcpyHostToDevice, stream_));
        KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host source may go when we return
      } else if (t.nbytes() > 0) {
        parts.push_back({t.raw(), at, static_cast<long long>(t.nbytes())});
      }
      out[g].push_back(std::move(copy));
      at += part_bytes(t.nbytes());
    }
  }
  copy_parts(parts);
  return out;
}

void CudaAllocator::copy_parts(std::span<const CopyPart> parts) {
  if (parts.empty()) return;
  // The part list goes to the device from pageable memory: cudaMemcpyAsync has staged it when it
  // returns, so `parts` may go; the list's device buffer returns to the cache when this returns,
  // and anything reusing it runs after the launch in stream order.
  std::shared_ptr<void> list = allocate_raw(parts.size() * sizeof(CopyPart));
  KILN_CUDA_CHECK(cudaMemcpyAsync(list.get(), parts.data(), parts.size() * sizeof(CopyPart),
                                  cudaMemcpyHostToDevice, stream_));
  launch_copy_parts(static_cast<const CopyPart*>(list.get()), static_cast<int64_t>(parts.size()),
                    stream_);
  KILN_CUDA_CHECK(cudaGetLastError());
}

std::vector<std::vector<Tensor>> CudaAllocator::copy_row_groups(
    std::span<const Tensor> sources, std::span<const int64_t> row_bounds) {
  KILN_CHECK(!row_bounds.empty(), "copy_row_groups: no row bounds");
  const size_t groups = row_bounds.size() - 1;
  for (const Tensor& s : sources)
    if (!s.defined() || s.device() != Device::kCuda || s.rank() < 1 || !s.is_contiguous() ||
        row_bounds.front() < 0 || row_bounds.back() > s.dim(0))
      return Allocator::copy_row_groups(sources, row_bounds);  // slices, checked there
  std::vector<size_t> row_bytes(sources.size());
  for (size_t s = 0; s < sources.size(); ++s)
    row_bytes[s] = sources[s].dim(0) == 0 ? 0 : sources[s].nbytes() / sources[s].dim(0);
  std::vector<std::vector<Tensor>> out(groups);
  std::vector<CopyPart> parts;
  parts.reserve(groups * sources.size());
  for (size_t g = 0; g < groups; ++g) {
    const int64_t begin = row_bounds[g], rows = row_bounds[g + 1] - begin;
    KILN_CHECK(rows >= 0, "copy_row_groups: row bounds {} > {}", begin, row_bounds[g + 1]);
    size_t total = 0;
    for (size_t s = 0; s < sources.size(); ++s) total += part_bytes(row_bytes[s] * rows);
    std::shared_ptr<void> memory = allocate_raw(std::max<size_t>(total, 1));
    const Tensor buffer =
        Tensor::view(DType::kI8, {static_cast<int64_t>(std::max<size_t>(total, 1))}, memory.get(),
                     memory, Device::kCuda);
    out[g].reserve(sources.size());
    size_t at = 0;
    for (size_t s = 0; s < sources.size(); ++s) {
      Shape shape = sources[s].shape();
      shape[0] = rows;
      const size_t bytes = row_bytes[s] * static_cast<size_t>(rows);
      out[g].push_back(buffer.view_at(sources[s].dtype(), std::move(shape), at));
      if (bytes > 0)
        parts.push_back({static_cast<const char*>(sources[s].raw()) + row_bytes[s] * begin,
                         static_cast<char*>(memory.get()) + at, static_cast<long long>(bytes)});
      at += part_bytes(bytes);
    }
  }
  copy_parts(parts);
  return out;
}

Tensor CudaAllocator::to_host(const Tensor& t) {
  if (t.device() == Device::kCpu) return t.clone();
  Tensor host = Tensor::empty(t.dtype(), t.shape());
  if (t.nbytes() > 0) {
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (after_read_) after_read_();
  }
  return host;
}

void CudaAllocator::copy_to_host(const Tensor& t, void* dst) {
  if (t.device() == Device::kCpu) {
    std::memcpy(dst, t.raw(), t.nbytes());
    return;
  }
  if (t.nbytes() == 0) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (after_read_) after_read_();
}

CudaContext::CudaContext(Context& host) : host_(host) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) cudaGetLastError();
  KILN_CHECK_USAGE(err == cudaSuccess && count > 0, "device cuda: no CUDA GPU is visible ({})",
                   err == cudaSuccess ? "0 devices" : cudaGetErrorString(err));
  KILN_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  sm_ = prop.major * 10 + prop.minor;
  sms_ = prop.multiProcessorCount;
  device_name_ = prop.name;
  KILN_CHECK_USAGE(sm_ >= 80, "device cuda: {} is sm_{}; kiln's CUDA kernels need sm_80 or newer",
                   device_name_, sm_);
  if (const char* p = std::getenv("KILN_CUDA_PROFILE")) {
    profile_steps_ = std::string_view(p) == "steps";
    profile_ = !profile_steps_;
  }
  auto off = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && std::string_view(v) == "0";
  };
  use_gemv_ = !off("KILN_CUDA_GEMV");
  use_graphs_ = !off("KILN_CUDA_GRAPHS");
  use_splits_ = !off("KILN_CUDA_SPLIT");
  use_warp_attention_ = !off("KILN_CUDA_WARP_ATTN");
  use_gemv_norm_ = !off("KILN_CUDA_GEMV_NORM");
  if (const char* v = std::getenv("KILN_CUDA_TILED_ROWS"))
    tiled_rows_ = std::string_view(v) == "32" ? 32 : 64;
  if (const char* v = std::getenv("KILN_CUDA_TILED"))
    tiled_attention_ = std::string_view(v) == "0"        ? TiledAttention::kOff
                       : std::string_view(v) == "always" ? TiledAttention::kAlways
                                                         : TiledAttention::kAuto;
  programmatic_ = sm_ >= 90 && !off("KILN_CUDA_PDL");
  // A whole number switch: digits only, in [lo, hi]; else a usage error naming it.
  auto number = [](const char* name, int lo, int hi, const char* what, int* out) {
    const char* v = std::getenv(name);
    if (v == nullptr) return;
    const std::string_view s(v);
    const bool digits = !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](char c) {
      return c >= '0' && c <= '9';
    });
    const long parsed = digits ? std::strtol(v, nullptr, 10) : -1;
    KILN_CHECK_USAGE(digits && parsed >= lo && parsed <= hi, "{}={}: give {}, {} to {}", name, v,
                     what, lo, hi);
    *out = static_cast<int>(parsed);
  };
  number("KILN_CUDA_GEMV_WARPS", 1, 64, "the warps per SM", &gemv_warps_forced_);
  number("KILN_CUDA_GEMV_NORM_WARPS", 1, 64, "the warps per SM", &gemv_norm_warps_);
  number("KILN_CUDA_GEMV_WIDE", 0, 2, "0 (off), 1 (after another Linear) or 2 (every one-row GEMV)",
         &gemv_wide_);
  number("KILN_CUDA_GEMV_ROWS", 1, kGemvMaxRows, "the most rows an untuned Linear runs on the GEMV",
         &gemv_rows_);
  number("KILN_CUDA_SKINNY_ROWS", 0, kSkinnyMaxRows,
         "the most rows an untuned Linear runs on the skinny GEMM (0: none)", &skinny_rows_);
  if (const char* v = std::getenv("KILN_CUDA_ATTN_WARPS")) {
    const std::string_view s(v);
    KILN_CHECK_USAGE(s == "0" || s == "4" || s == "8" || s == "16",
                     "KILN_CUDA_ATTN_WARPS={}: give 16, 8 or 4 (0: by the key count)", v);
    attention_warps_ = std::atoi(v);
  }
  defer_checks_ = !off("KILN_CUDA_DEFER_CHECK");
  upload_threads_ = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 8);
  number("KILN_CUDA_UPLOAD_THREADS", 0, 32,
         "the threads that upload a plan's weights (0: each weight alone, when first used)",
         &upload_threads_);
  number("KILN_CUDA_UPLOAD_CHUNK_MB", 1, 64, "the MiB a weight upload thread stages at a time",
         &upload_chunk_mib_);
  if (const char* v = std::getenv("KILN_CUDA_TACTICS_INEXACT")) {
    KILN_CHECK_USAGE(std::string_view(v) == "0" || std::string_view(v) == "1",
                     "KILN_CUDA_TACTICS_INEXACT={}: give 1 or 0", v);
    inexact_tactics_ = std::string_view(v) == "1";
  }
  const std::string no_blas = cublaslt_load_error();
  KILN_CHECK_USAGE(no_blas.empty(), "device cuda: {}", no_blas);
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  allocator_ = CudaAllocator(stream_);  // the cache of the placeholder is empty
  KILN_CUBLAS_CHECK(cublasLtCreate(&blas_));
  KILN_CUDA_CHECK(cudaMalloc(&blas_workspace_, kBlasWorkspaceBytes));
  note_malloc(kBlasWorkspaceBytes);
  g_library_workspace += static_cast<long long>(kBlasWorkspaceBytes);
  KILN_CUDA_CHECK(cudaMalloc(&status_, sizeof(DeviceStatus)));
  KILN_CUDA_CHECK(cudaMemset(status_, 0, sizeof(DeviceStatus)));
  KILN_CUDA_CHECK(cudaMallocHost(&status_host_, kMaxPending * sizeof(DeviceStatus)));
  for (int i = 0; i < kMaxPending; ++i) {
    status_host_[i] = DeviceStatus{};
    checks_[i].host = status_host_ + i;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&checks_[i].copied, cudaEventDisableTiming));
  }
  for (cudaEvent_t& e : step_copied_)
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&argmax_copied_, cudaEventDisableTiming));
  for (cudaEvent_t& e : gather_copied_)
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  allocator_.set_after_read([this] { synchronize(); });
  split_scratch_ =
      allocator_.allocate(static_cast<size_t>(kSplitBlocks) * (kMaxHeadDim + 2) * sizeof(float));
}

CudaContext::~CudaContext() {
  weights_.clear();
  // Device buffers go back to the allocator while its stream exists.
  argmax_device_.reset();
  topk_device_.reset();
  split_scratch_.reset();
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  cudaFree(step_device_);
  cudaFreeHost(step_host_);
  cudaFree(status_);
  cudaFreeHost(status_host_);
  cudaFreeHost(argmax_host_);
  cudaFreeHost(gather_host_);
  for (cudaEvent_t e : gather_copied_)
    if (e != nullptr) cudaEventDestroy(e);
  for (PendingCheck& c : checks_)
    if (c.copied != nullptr) cudaEventDestroy(c.copied);
  for (cudaEvent_t e : step_copied_)
    if (e != nullptr) cudaEventDestroy(e);
  if (argmax_copied_ != nullptr) cudaEventDestroy(argmax_copied_);
  if (blas_workspace_ != nullptr) {
    free_block(blas_workspace_, kBlasWorkspaceBytes);
    g_library_workspace -= static_cast<long long>(kBlasWorkspaceBytes);
  }
  if (blas_ != nullptr) cublasLtDestroy(blas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaContext::finish_step(const Graph& graph, bool wait) {
  if (pending_ == kMaxPending) check_oldest();
  PendingCheck& c = checks_[(first_check_ + pending_) % kMaxPending];
  // A kernel, not a copy: between two decode steps each copy in the stream costs several
  // microseconds of the GPU's time, a kernel under programmatic launch about one.
  launch_publish_status(status_, c.host, kernel_stream());
  KILN_CUDA_CHECK(cudaGetLastError());
  KILN_CUDA_CHECK(cudaEventRecord(c.copied, stream_));
  c.graph = &graph;
  c.number = ++checks_made_;
  ++pending_;
  if (wait || !defer_checks_) synchronize();
}

void CudaContext::check_oldest() {
  PendingCheck& c = checks_[first_check_];
  KILN_CUDA_CHECK(cudaEventSynchronize(c.copied));
  const Graph& graph = *c.graph;
  const DeviceStatus st = *c.host;
  first_check_ = (first_check_ + 1) % kMaxPending;
  --pending_;
  if (st.code == kStatusOk) return;
  // The status word keeps what the failed step wrote: the steps queued after it are not
  // checked on their own (their results are not trusted either), and the word is cleared.
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  pending_ = 0;
  KILN_CUDA_CHECK(cudaMemsetAsync(status_, 0, sizeof(DeviceStatus), stream_));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::string node = st.node >= 0 && st.node < static_cast<int>(graph.nodes.size())
                               ? graph.nodes[st.node].name
                               : "?";
  switch (st.code) {
    case kStatusTokenId:
      KILN_FAIL("node '{}': token id {} is outside the vocabulary [0, {})", node, st.value,
                st.limit);
    case kStatusGatherRow:
      KILN_FAIL("node '{}': row {} out of range [0, {})", node, st.value, st.limit);
    case kStatusKvBlock:
      KILN_FAIL("node '{}': the block table names KV block {}, the storage holds {}", node,
                st.value, st.limit);
    default:
      KILN_FAIL("node '{}': the GPU reported error {}", node, st.code);
  }
}

void CudaContext::synchronize() {
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  KILN_CUDA_CHECK(cudaGetLastError());
  while (pending_ > 0) check_oldest();
}

void CudaContext::abandon_step() {
  // The pending checks' copies were queued before this step's kernels: they stay, and hold
  // only what the steps before reported.
  cudaStreamSynchronize(stream_);
  cudaMemsetAsync(status_, 0, sizeof(DeviceStatus), stream_);
  cudaStreamSynchronize(stream_);
}

void CudaContext::forget_step(const Graph& graph) {
  bool mine = false;
  for (int i = 0; i < pending_; ++i)
    mine |= checks_[(first_check_ + i) % kMaxPending].graph == &graph;
  if (!mine) return;
  try {
    synchronize();
  } catch (const std::exception& e) {
    host_.log().warn("graph '{}' went away with an unchecked step: {}", graph.name, e.what());
  }
}

void CudaContext::launch_uploads(UploadList& list) {
  long long total = 0;
  for (int i = 0; i < list.count; ++i) total += list.part[i].bytes;
  if (total <= UploadList::kMaxBytes) {
    ::kiln::cuda::launch_uploads(list, kernel_stream());
    KILN_CUDA_CHECK(cudaGetLastError());
  } else {
    for (int i = 0; i < list.count; ++i)
      if (list.part[i].bytes > 0)
        KILN_CUDA_CHECK(cudaMemcpyAsync(list.part[i].dst, list.part[i].src,
                                        static_cast<size_t>(list.part[i].bytes), cudaMemcpyDefault,
                                        stream_));
  }
  list.count = 0;
  launches_at_uploads_ = launches_;  // copies too: a kernel right behind them is plain
  if (step_copy_due_) KILN_CUDA_CHECK(cudaEventRecord(step_copied_[step_half_], stream_));
  step_copy_due_ = false;
}

void CudaContext::upload_step(const StepLayout& layout, UploadList& list) {
  KILN_CHECK(list.count < UploadList::kMax, "upload_step: the upload list is full");
  const int seqs = layout.num_seqs();
  const int64_t tokens = layout.total_tokens();
  int cross_layers = 0;
  for (const CrossKv* c : layout.cross)
    if (c != nullptr) cross_layers = std::max(cross_layers, static_cast<int>(c->keys.size()));
  // The block table's row stride only grows (in powers of two), so that a decode step's device
  // layout keeps the same addresses and widths from one step to the next while its sequences
  // grow: a CUDA graph captured for it stays valid.
  while (block_stride_ < layout.max_blocks) block_stride_ = std::max(2 * block_stride_, 16);
  const int stride = block_stride_;
  // Layout of the buffer: pointers first (8-byte aligned), then the int arrays.
  const size_t pointers = static_cast<size_t>(seqs) * cross_layers * 2;
  const size_t ints = static_cast<size_t>(seqs + 1) + seqs + static_cast<size_t>(tokens) +
                      static_cast<size_t>(seqs) * stride + seqs;
  const size_t bytes = pointers * sizeof(void*) + ints * sizeof(int);
  if (bytes > step_capacity_) {
    const size_t grown = std::max<size_t>(bytes * 2, 4096);
    if (step_device_ != nullptr) {
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
      cudaFree(step_device_);
      cudaFreeHost(step_host_);
      step_device_ = step_host_ = nullptr;
    }
    KILN_CUDA_CHECK(cudaMalloc(&step_device_, grown));
    KILN_CUDA_CHECK(cudaMallocHost(&step_host_, 2 * grown));
    step_capacity_ = grown;
  }
  // This half's last copy (two steps ago) may still be reading it.
  step_half_ ^= 1;
  KILN_CUDA_CHECK(cudaEventSynchronize(step_copied_[step_half_]));
  void* packed = static_cast<char*>(step_host_) + step_half_ * step_capacity_;
  auto** ptr = static_cast<const void**>(packed);
  for (int s = 0; s < seqs; ++s)
    for (int l = 0; l < cross_layers; ++l) {
      const CrossKv* c = layout.cross[s];
      const bool has = c != nullptr && l < static_cast<int>(c->keys.size());
      ptr[static_cast<size_t>(s) * cross_layers + l] = has ? c->keys[l].raw() : nullptr;
      ptr[pointers / 2 + static_cast<size_t>(s) * cross_layers + l] =
          has ? c->values[l].raw() : nullptr;
    }
  int* ints_host = reinterpret_cast<int*>(ptr + pointers);
  int* at = ints_host;
  const size_t begin_off = 0;
  at = std::copy(layout.token_begin.begin(), layout.token_begin.end(), at);
  const size_t past_off = static_cast<size_t>(at - ints_host);
  at = std::copy(layout.past_len.begin(), layout.past_len.end(), at);
  const size_t seq_off = static_cast<size_t>(at - ints_host);
  for (int s = 0; s < seqs; ++s)
    for (int64_t r = layout.token_begin[s]; r < layout.token_begin[s + 1]; ++r) *at++ = s;
  const size_t table_off = static_cast<size_t>(at - ints_host);
  for (int s = 0; s < seqs; ++s) {
    const std::span<const int32_t> row = layout.blocks(s);
    at = std::copy(row.begin(), row.end(), at);
    at = std::fill_n(at, stride - static_cast<int>(row.size()), -1);
  }
  const size_t cross_off = static_cast<size_t>(at - ints_host);
  for (int s = 0; s < seqs; ++s)
    *at++ = layout.cross[s] != nullptr ? static_cast<int>(layout.cross[s]->length()) : 0;
  list.part[list.count++] = {packed, step_device_, static_cast<long long>(bytes), true};
  step_copy_due_ = true;
  const void* const* dptr = static_cast<const void* const*>(step_device_);
  const int* dints = reinterpret_cast<const int*>(dptr + pointers);
  step_.num_seqs = seqs;
  step_.max_blocks = stride;
  step_.token_begin = dints + begin_off;
  step_.past_len = dints + past_off;
  step_.token_seq = dints + seq_off;
  step_.block_table = dints + table_off;
  step_.cross_len = dints + cross_off;
  step_.cross_layers = cross_layers;
  step_.cross_k = dptr;
  step_.cross_v = dptr + pointers / 2;
  int64_t longest = 0;
  step_longest_rows_ = 0;
  for (int s = 0; s < seqs; ++s) {
    step_longest_rows_ = std::max(step_longest_rows_, layout.num_tokens(s));
    longest = std::max(longest, layout.past_len[s] + layout.num_tokens(s));
    if (layout.cross[s] != nullptr) longest = std::max(longest, layout.cross[s]->length());
  }
  step_key_class_ = use_splits_ ? attention_key_class(longest) : 0;
  step_key_bucket_ = attention_key_bucket(longest);
}

Tensor CudaContext::device_weight(const Tensor& host) {
  if (host.device() == Device::kCuda) return host;
  auto it = weights_.find(host.raw());
  if (it != weights_.end() && it->second.first.nbytes() == host.nbytes() &&
      it->second.first.dtype() == host.dtype())
    return Tensor::view(host.dtype(), host.shape(), it->second.second.raw(),
                        std::make_shared<Tensor>(it->second.second), Device::kCuda);
  Tensor device = allocator_.upload(host);
  weights_[host.raw()] = {host, device};
  return device;
}

UploadStats CudaContext::upload_weights(std::span<const Tensor> hosts) {
  std::vector<Tensor> todo;
  std::set<const void*> seen;
  for (const Tensor& h : hosts) {
    if (!h.defined() || h.device() == Device::kCuda || h.nbytes() == 0 || !h.is_contiguous())
      continue;
    if (weights_.count(h.raw()) > 0 || !seen.insert(h.raw()).second) continue;
    todo.push_back(h);
  }
  if (todo.empty() || upload_threads_ == 0) return {};
  const UploadLayout layout = plan_upload(todo);
  std::shared_ptr<void> memory = allocator_.allocate_raw(layout.device_bytes);
  // Cached memory may still be read by work queued on this context's stream.
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const UploadStats stats = run_upload(layout, memory.get(), upload_threads_,
                                       static_cast<size_t>(upload_chunk_mib_) << 20);
  char* base = static_cast<char*>(memory.get());
  for (size_t i = 0; i < todo.size(); ++i)
    weights_[todo[i].raw()] = {
        todo[i], Tensor::view(todo[i].dtype(), todo[i].shape(), base + layout.device_offset[i],
                              memory, Device::kCuda)};
  return stats;
}

Tensor CudaContext::filled_vector(DType dtype, int64_t n, float value) {
  Tensor& t = filled_[{dtype, n, value}];
  if (!t.defined())
    t = allocator_.upload(Tensor::from_vector(std::vector<float>(n, value), {n}).to(dtype));
  return t;
}

}  // namespace kiln::cuda

namespace kiln {

void cuda_memory_peak_reset() { cuda::g_peak_held = cuda::g_held.load(); }

long long cuda_memory_held_bytes() { return cuda::g_held.load(); }

long long cuda_library_workspace_bytes() { return cuda::g_library_workspace.load(); }

long long cuda_memory_peak_bytes() {
  const long long now = cuda_memory_used_bytes();
  if (now < 0) return now;
  return now + std::max(0LL, cuda::g_peak_held.load() - cuda::g_held.load());
}

}  // namespace kiln
