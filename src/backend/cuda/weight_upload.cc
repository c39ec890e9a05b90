#include "backend/cuda/weight_upload.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "backend/cuda/cuda_context.h"

namespace kiln::cuda {

UploadLayout plan_upload(std::span<const Tensor> hosts, size_t max_gap) {
  UploadLayout layout;
  layout.device_offset.assign(hosts.size(), 0);
  std::vector<size_t> order(hosts.size());
  std::iota(order.begin(), order.end(), 0);
  for (const Tensor& t : hosts)
    KILN_CHECK(t.defined() && t.device() == Device::kCpu && t.is_contiguous() && t.nbytes() > 0,
               "plan_upload: a weight to upload is not a contiguous, non-empty host tensor");
  auto start = [&](size_t i) { return static_cast<const char*>(hosts[i].raw()); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return start(a) < start(b); });
  // Ranges in address order of their first tensor: a tensor joins the open range of its
  // address's remainder modulo 256 when it starts at most max_gap past that range's end (views
  // of one buffer overlap it), so that it lands 256-aligned on the device; otherwise it opens
  // one (tensors at other remainders, views at odd offsets, may overlap it: both are copied).
  std::vector<size_t> range_of(hosts.size());
  std::vector<const char*> ends;        // per range: its end
  std::map<uintptr_t, size_t> open_of;  // remainder modulo 256 -> its open range
  for (size_t i : order) {
    const char* s = start(i);
    const char* e = s + hosts[i].nbytes();
    const uintptr_t phase = reinterpret_cast<uintptr_t>(s) % 256;
    auto open = open_of.find(phase);
    if (open == open_of.end() || s > ends[open->second] + max_gap) {
      layout.ranges.push_back({s, 0, 0});
      ends.push_back(e);
      open_of[phase] = layout.ranges.size() - 1;
    }
    const size_t r = open_of[phase];
    ends[r] = std::max(ends[r], e);
    layout.ranges[r].bytes = static_cast<size_t>(ends[r] - layout.ranges[r].host);
    range_of[i] = r;
    layout.tensor_bytes += hosts[i].nbytes();
  }
  // Device offsets: each range 256-aligned, so each tensor is (whatever its host alignment: a
  // checkpoint's tensors sit where the safetensors header's length put them, and cuBLASLt
  // refuses an fp16 matrix that is not 16-byte aligned).
  size_t at = 0;
  for (UploadLayout::Range& r : layout.ranges) {
    at = (at + 255) / 256 * 256;
    r.device_offset = at;
    at += r.bytes;
  }
  layout.device_bytes = std::max<size_t>(at, 1);
  for (size_t i = 0; i < hosts.size(); ++i) {
    const UploadLayout::Range& r = layout.ranges[range_of[i]];
    layout.device_offset[i] = r.device_offset + static_cast<size_t>(start(i) - r.host);
  }
  return layout;
}

namespace {

struct Chunk {
  const char* host;
  char* device;
  size_t bytes;
};

// One worker: its stream, two staging buffers used in turn, an event per buffer marking when
// its copy has left it.
struct Worker {
  cudaStream_t stream = nullptr;
  char* staging[2] = {nullptr, nullptr};
  cudaEvent_t copied[2] = {nullptr, nullptr};
  bool used[2] = {false, false};
  int turn = 0;  // the buffer the next chunk goes to
};

}  // namespace

UploadStats run_upload(const UploadLayout& layout, void* device, int threads, size_t chunk_bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  KILN_CHECK(threads >= 1 && chunk_bytes >= 4096, "run_upload: {} threads, chunks of {} bytes",
             threads, chunk_bytes);
  std::vector<Chunk> chunks;
  size_t total = 0;
  for (const UploadLayout::Range& r : layout.ranges) {
    for (size_t off = 0; off < r.bytes; off += chunk_bytes)
      chunks.push_back({r.host + off, static_cast<char*>(device) + r.device_offset + off,
                        std::min(chunk_bytes, r.bytes - off)});
    total += r.bytes;
  }
  UploadStats stats;
  stats.chunk_bytes = chunk_bytes;
  stats.copied_bytes = total;
  stats.threads = static_cast<int>(std::min<size_t>(threads, std::max<size_t>(chunks.size(), 1)));
  if (chunks.empty()) return stats;
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  // One pinned allocation for every staging buffer (pinning is the slow part of it).
  char* pinned = nullptr;
  KILN_CUDA_CHECK(cudaMallocHost(&pinned, 2 * chunk_bytes * stats.threads));
  std::vector<Worker> workers(stats.threads);
  std::atomic<size_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&](int w) {
    Worker& me = workers[w];
    try {
      KILN_CUDA_CHECK(cudaSetDevice(dev));
      for (size_t i = next.fetch_add(1); i < chunks.size() && !error; i = next.fetch_add(1)) {
        const int b = me.turn;
        me.turn ^= 1;
        if (me.used[b]) KILN_CUDA_CHECK(cudaEventSynchronize(me.copied[b]));
        std::memcpy(me.staging[b], chunks[i].host, chunks[i].bytes);
        KILN_CUDA_CHECK(cudaMemcpyAsync(chunks[i].device, me.staging[b], chunks[i].bytes,
                                        cudaMemcpyHostToDevice, me.stream));
        KILN_CUDA_CHECK(cudaEventRecord(me.copied[b], me.stream));
        me.used[b] = true;
      }
      KILN_CUDA_CHECK(cudaStreamSynchronize(me.stream));
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  try {
    for (int w = 0; w < stats.threads; ++w) {
      Worker& me = workers[w];
      KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&me.stream, cudaStreamNonBlocking));
      for (int b = 0; b < 2; ++b) {
        me.staging[b] = pinned + (2 * static_cast<size_t>(w) + b) * chunk_bytes;
        KILN_CUDA_CHECK(cudaEventCreateWithFlags(&me.copied[b], cudaEventDisableTiming));
      }
    }
  } catch (...) {
    error = std::current_exception();
  }
  stats.setup_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!error) {
    std::vector<std::thread> pool;
    for (int w = 1; w < stats.threads; ++w) pool.emplace_back(work, w);
    work(0);
    for (std::thread& t : pool) t.join();
  }
  for (Worker& me : workers) {
    for (cudaEvent_t e : me.copied)
      if (e != nullptr) cudaEventDestroy(e);
    if (me.stream != nullptr) cudaStreamDestroy(me.stream);
  }
  cudaFreeHost(pinned);
  if (error) std::rethrow_exception(error);
  stats.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace kiln::cuda
