// CUDA is compiled whenever nvcc is found; these tests run on a machine with a GPU and are
// skipped, saying why, everywhere else.
#include <gtest/gtest.h>

#include <array>
#include <string>

#include "../scoped_env.h"
#include "backend/backend.h"
#include "backend/cuda_info.h"
#include "builder/builder.h"
#include "runtime/compiled_model.h"
#include "runtime/forward.h"
#if KILN_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_options.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/weight_upload.h"
#endif

namespace kiln {
namespace {

TEST(Cuda, DeviceIsVisibleWhenPresent) {
  const CudaInfo info = query_cuda();
  if (!info.compiled) GTEST_SKIP() << "kiln was built without CUDA";
  if (info.device_count == 0) GTEST_SKIP() << "no GPU visible: " << info.error;
  EXPECT_FALSE(info.first_device.empty());
  EXPECT_NE(info.first_device.find("sm_"), std::string::npos) << info.first_device;
}

#if KILN_HAVE_CUDA
// Host-side choices of the CUDA backend, testable without a GPU.

// Every CUDA switch is one field of CudaOptions with its default, set from the environment in
// from_environment() alone and listed by describe() (what `kiln inspect --device` prints).
TEST(Cuda, OptionsHaveDefaultsAndAreReadFromTheEnvironmentInOnePlace) {
  const cuda::CudaOptions defaults;
  const cuda::CudaOptions plain = cuda::CudaOptions::from_environment();
  EXPECT_TRUE(plain.graphs && plain.gemv && plain.programmatic_launch && plain.defer_checks);
  EXPECT_EQ(plain.gemv_rows, defaults.gemv_rows);
  EXPECT_EQ(plain.skinny_rows, defaults.skinny_rows);
  EXPECT_EQ(plain.graph_tokens, 256);
  EXPECT_EQ(plain.gemm_row_bucket, 64);
  EXPECT_EQ(plain.i8_gemv_rows, cuda::kI8GemvDefaultRows);
  EXPECT_EQ(plain.w8a8_gemv_rows, cuda::kW8a8GemvDefaultRows);
  EXPECT_EQ(plain.profile, cuda::CudaOptions::Profile::kOff);
  const std::vector<BackendOption> listed = plain.describe();
  EXPECT_EQ(listed.size(), 23u) << "every KILN_CUDA_* switch";
  for (const BackendOption& o : listed) {
    EXPECT_TRUE(o.variable.starts_with("KILN_CUDA_")) << o.variable;
    EXPECT_FALSE(o.value.empty() || o.meaning.empty()) << o.variable;
  }
  {
    const test::ScopedEnv graphs("KILN_CUDA_GRAPHS", "0");
    const test::ScopedEnv rows("KILN_CUDA_GEMV_ROWS", "3");
    const test::ScopedEnv tiled("KILN_CUDA_TILED", "always");
    const test::ScopedEnv profile("KILN_CUDA_PROFILE", "steps");
    const test::ScopedEnv graph_tokens("KILN_CUDA_GRAPH_TOKENS", "128");
    const test::ScopedEnv bucket("KILN_CUDA_GEMM_ROW_BUCKET", "0");
    const test::ScopedEnv w8a8("KILN_CUDA_W8A8_GEMV_ROWS", "32");
    const cuda::CudaOptions set = cuda::CudaOptions::from_environment();
    EXPECT_EQ(set.w8a8_gemv_rows, 32);
    EXPECT_FALSE(set.graphs);
    EXPECT_EQ(set.gemm_row_bucket, 0);
    EXPECT_EQ(set.graph_tokens, 128);
    EXPECT_EQ(set.gemv_rows, 3);
    EXPECT_EQ(set.tiled_attention, cuda::TiledAttention::kAlways);
    EXPECT_EQ(set.profile, cuda::CudaOptions::Profile::kSteps);
    EXPECT_TRUE(set.gemv) << "what is not set keeps its default";
    bool shown = false;
    for (const BackendOption& o : set.describe())
      shown |= o.variable == "KILN_CUDA_GEMV_ROWS" && o.value == "3";
    EXPECT_TRUE(shown);
  }
  for (const char* var : {"KILN_CUDA_SKINNY_ROWS", "KILN_CUDA_W8A8_GEMV_ROWS"}) {
    const test::ScopedEnv bad(var, "33");
    try {
      cuda::CudaOptions::from_environment();
      ADD_FAILURE() << var << "=33 was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(e.what()).find(std::string(var) + "=33"), std::string::npos);
    }
  }
}

// A Linear's tactic at n rows: the one timed at n, the next larger timed count's up to 64 rows
// (decode batches), none (cuBLASLt's heuristic for n) for other counts above (prompts); with
// `inexact`, the next larger timed count's at every n.
TEST(Cuda, TacticForRowsUsesTimedCountsOnly) {
  std::vector<LinearTactic> tactics;
  for (int64_t rows : {1, 2, 4, 8, 16, 64, 256, 1024, 4096, 8192})
    tactics.push_back({rows, rows <= 2 ? "gemv" : "cublaslt", "", 1.0f});
  auto rows_of = [&](int64_t n, bool inexact) {
    const LinearTactic* t = cuda::tactic_for_rows(tactics, n, inexact);
    return t == nullptr ? int64_t{-1} : t->rows;
  };
  for (bool inexact : {false, true}) {
    EXPECT_EQ(rows_of(1, inexact), 1);
    EXPECT_EQ(rows_of(3, inexact), 4);  // up to 64 rows: the next larger timed count
    EXPECT_EQ(rows_of(8, inexact), 8);
    EXPECT_EQ(rows_of(12, inexact), 16);  // a decode batch of 12
    EXPECT_EQ(rows_of(33, inexact), 64);
    EXPECT_EQ(rows_of(4096, inexact), 4096);
  }
  EXPECT_EQ(rows_of(78, false), -1);    // a prompt of 78 tokens
  EXPECT_EQ(rows_of(4992, false), -1);  // a batch-64 prompt of 78 tokens
  EXPECT_EQ(rows_of(9000, false), -1);
  EXPECT_EQ(rows_of(78, true), 256);
  EXPECT_EQ(rows_of(4992, true), 8192);
  EXPECT_EQ(rows_of(9000, true), 8192);
  EXPECT_EQ(cuda::tactic_for_rows({}, 1, false), nullptr);
  EXPECT_EQ(cuda::tactic_for_rows({}, 1, true), nullptr);
}

// The key-count buckets a batch-1 decode graph is captured per (the warp attention's block size
// follows them): 64 keys each, all counts above four buckets in one.
TEST(Cuda, AttentionKeyBuckets) {
  EXPECT_EQ(cuda::attention_key_bucket(0), 0);
  EXPECT_EQ(cuda::attention_key_bucket(1), 1);
  EXPECT_EQ(cuda::attention_key_bucket(64), 1);
  EXPECT_EQ(cuda::attention_key_bucket(65), 2);
  EXPECT_EQ(cuda::attention_key_bucket(128), 2);
  EXPECT_EQ(cuda::attention_key_bucket(256), 4);
  EXPECT_EQ(cuda::attention_key_bucket(257), 5);
  EXPECT_EQ(cuda::attention_key_bucket(100000), 5);
  // Only steps of a block per SM or fewer, sizes not forced, follow the bucket.
  EXPECT_TRUE(cuda::warps_follow_keys(16, 132, 0));
  EXPECT_TRUE(cuda::warps_follow_keys(132, 132, 0));
  EXPECT_FALSE(cuda::warps_follow_keys(133, 132, 0));
  EXPECT_FALSE(cuda::warps_follow_keys(16, 132, 8));
}
#endif

// The CUDA backend's numeric and on/off A/B switches (GEMV rows and warps, attention warps,
// inexact tactics) refuse values they do not take, naming the variable and the value, instead
// of running with a default the user did not ask for; the values they take are accepted.
TEST(Cuda, BadInputSwitchValuesAreRefused) {
  const CudaInfo info = query_cuda();
  if (info.device_count == 0) GTEST_SKIP() << "no GPU visible: the switches are read with a device";
  const std::pair<const char*, const char*> bad[] = {
      {"KILN_CUDA_GEMV_ROWS", "0"},        {"KILN_CUDA_GEMV_ROWS", "9"},
      {"KILN_CUDA_GEMV_ROWS", "2x"},       {"KILN_CUDA_GEMV_ROWS", " 3"},
      {"KILN_CUDA_GEMV_ROWS", "+3"},       {"KILN_CUDA_GEMV_WARPS", "0"},
      {"KILN_CUDA_GEMV_WARPS", ""},        {"KILN_CUDA_ATTN_WARPS", "3"},
      {"KILN_CUDA_GEMV_WIDE", "3"},        {"KILN_CUDA_GEMV_WIDE", "on"},
      {"KILN_CUDA_SKINNY_ROWS", "33"},     {"KILN_CUDA_SKINNY_ROWS", "-1"},
      {"KILN_CUDA_TACTICS_INEXACT", "yes"}};
  for (const auto& [name, value] : bad) {
    const test::ScopedEnv env(name, value);
    Context ctx(ContextOptions{LogLevel::kError, 1});
    try {
      make_cuda_backend(ctx);
      ADD_FAILURE() << name << "=" << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(name) + "=" + value), std::string::npos)
          << e.what();
    }
  }
  const std::pair<const char*, const char*> good[] = {
      {"KILN_CUDA_GEMV_ROWS", "1"},      {"KILN_CUDA_GEMV_ROWS", "8"},
      {"KILN_CUDA_GEMV_WARPS", "16"},    {"KILN_CUDA_ATTN_WARPS", "8"},
      {"KILN_CUDA_GEMV_WIDE", "0"},      {"KILN_CUDA_GEMV_WIDE", "2"},
      {"KILN_CUDA_SKINNY_ROWS", "0"},    {"KILN_CUDA_SKINNY_ROWS", "32"},
      {"KILN_CUDA_TACTICS_INEXACT", "1"}};
  for (const auto& [name, value] : good) {
    const test::ScopedEnv env(name, value);
    Context ctx(ContextOptions{LogLevel::kError, 1});
    EXPECT_NO_THROW(make_cuda_backend(ctx)) << name << "=" << value;
  }
}

// Decode steps of one shape launch kernel by kernel the first time, are captured as a CUDA graph
// the second and replayed from then on; the executor counts each launch (the server's
// kiln_step_launches_total). CPU executables count nothing.
TEST(Cuda, StepLaunchesAreCounted) {
  const std::string model = std::string(KILN_FIXTURES_DIR) + "/bloom-tiny";
  Context ctx(ContextOptions{LogLevel::kError, 1});
  Logger quiet(LogLevel::kError);
  {
    CompiledModel cpu(ctx, build_model(model, BuildOptions{}, quiet));
    run_forward(cpu, {}, {5, 6, 7, 8}, /*step_by_step=*/true);
    const StepLaunchStats s = cpu.decoder().launch_stats();
    EXPECT_EQ(s.replayed + s.captured + s.eager, 0);
  }
  const CudaInfo info = query_cuda();
  if (info.device_count == 0)
    GTEST_SKIP() << "no GPU visible: " << (info.compiled ? info.error : "built without CUDA");
  BuildOptions o;
  o.device = Device::kCuda;
  o.precision = Precision::kFp16;
  CompiledModel engine(ctx, build_model(model, o, quiet));
  run_forward(engine, {}, {5, 6, 7, 8, 9, 10, 11, 12}, /*step_by_step=*/true);
  const StepLaunchStats s = engine.decoder().launch_stats();
  EXPECT_EQ(s.replayed + s.captured + s.eager, 8);
  EXPECT_GE(s.eager, 1);
  EXPECT_GE(s.captured, 1);
  EXPECT_GE(s.replayed, 1);
  EXPECT_GT(s.capture_ms, 0.0);
}

// The peak `kiln bench` reports counts a block that was freed before anyone read the device's
// use: 300 MB (above the allocator's cached size, so really freed) allocated and dropped after a
// reset shows in the peak and not in the use now; a reset forgets it; without a GPU, -1.
TEST(Cuda, MemoryPeakCountsBlocksFreedBeforeTheReading) {
  const CudaInfo info = query_cuda();
  if (info.device_count == 0) {
    EXPECT_EQ(cuda_memory_peak_bytes(), -1);
    GTEST_SKIP() << "no GPU visible: " << (info.compiled ? info.error : "built without CUDA");
  }
  Context ctx(ContextOptions{LogLevel::kError, 1});
  auto backend = make_cuda_backend(ctx);
  constexpr long long kBlock = 300ll << 20;
  cuda_memory_peak_reset();
  const long long before = cuda_memory_used_bytes();
  backend->allocator().allocate(static_cast<size_t>(kBlock)).reset();
  const long long after = cuda_memory_used_bytes();
  EXPECT_LT(after, before + kBlock / 2) << "the 300 MB block was not given back";
  EXPECT_GE(cuda_memory_peak_bytes(), after + kBlock);
  cuda_memory_peak_reset();
  EXPECT_LT(cuda_memory_peak_bytes(), cuda_memory_used_bytes() + kBlock / 2);
}

// What `kiln bench` sets against a GPU's memory budget: kiln's held bytes grow by a block while it
// is live, and the context's cuBLASLt workspace counts among them and among the libraries'
// workspaces; the device's use minus the held bytes (the CUDA context) stays put.
TEST(Cuda, MemoryHeldCountsBlocksAndTheLibraryWorkspace) {
  const CudaInfo info = query_cuda();
  if (info.device_count == 0) {
    EXPECT_EQ(cuda_memory_held_bytes(), 0);
    EXPECT_EQ(cuda_library_workspace_bytes(), 0);
    GTEST_SKIP() << "no GPU visible: " << (info.compiled ? info.error : "built without CUDA");
  }
  Context ctx(ContextOptions{LogLevel::kError, 1});
  const long long library_before = cuda_library_workspace_bytes();
  auto backend = make_cuda_backend(ctx);
  const long long library = cuda_library_workspace_bytes() - library_before;
  EXPECT_GT(library, 0) << "the cuBLASLt workspace is not counted";
  const long long held = cuda_memory_held_bytes();
  EXPECT_GE(held, library);
  const long long outside = cuda_memory_used_bytes() - held;
  constexpr long long kBlock = 300ll << 20;
  {
    std::shared_ptr<void> block = backend->allocator().allocate(static_cast<size_t>(kBlock));
    EXPECT_EQ(cuda_memory_held_bytes(), held + kBlock);
    EXPECT_NEAR(static_cast<double>(cuda_memory_used_bytes() - cuda_memory_held_bytes()),
                static_cast<double>(outside), 64.0 * (1 << 20));
  }
  backend.reset();
  EXPECT_EQ(cuda_library_workspace_bytes(), library_before);
}

#if KILN_HAVE_CUDA
// The kernel that uploads a decode step's layout and inputs (launch_uploads) copies every part:
// pinned host sources (16-byte aligned with a tail of single bytes, unaligned, longer than one
// block's share) and a device source; a second launch after the host rewrote its buffers reads
// the new bytes, not lines cached from the first.
TEST(Cuda, UploadsKernelCopiesHostAndDeviceParts) {
  const CudaInfo info = query_cuda();
  if (info.device_count == 0)
    GTEST_SKIP() << "no GPU visible: " << (info.compiled ? info.error : "built without CUDA");
  constexpr size_t kHost = 50000, kDevice = 4096;
  unsigned char* host = nullptr;
  unsigned char* dev = nullptr;
  ASSERT_EQ(cudaMallocHost(&host, kHost), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dev, 2 * kHost + kDevice), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  // {source offset in host, bytes, destination offset in dev}
  const std::vector<std::array<size_t, 3>> host_parts = {
      {0, 1000, 0}, {4096 + 3, 77, 2048 + 5}, {8192, 40000, 8192}, {49000, 16, 49000}};
  std::vector<unsigned char> device_src(kDevice);
  for (size_t i = 0; i < kDevice; ++i) device_src[i] = static_cast<unsigned char>(i * 7 + 1);
  unsigned char* dsrc = dev + 2 * kHost;
  ASSERT_EQ(cudaMemcpy(dsrc, device_src.data(), kDevice, cudaMemcpyHostToDevice), cudaSuccess);
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < kHost; ++i) host[i] = static_cast<unsigned char>(i * 13 + 29 * round);
    ASSERT_EQ(cudaMemset(dev, 0, 2 * kHost), cudaSuccess);
    cuda::UploadList list;
    for (const auto& [from, bytes, to] : host_parts)
      list.part[list.count++] = {host + from, dev + to, static_cast<long long>(bytes), true};
    list.part[list.count++] = {dsrc + 16, dev + kHost + 16, static_cast<long long>(kDevice - 19),
                               false};
    cuda::launch_uploads(list, cuda::KernelStream(stream));
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<unsigned char> got(2 * kHost);
    ASSERT_EQ(cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<unsigned char> want(2 * kHost, 0);
    for (const auto& [from, bytes, to] : host_parts) std::memcpy(&want[to], host + from, bytes);
    std::memcpy(&want[kHost + 16], device_src.data() + 16, kDevice - 19);
    EXPECT_EQ(got, want) << "round " << round;
  }
  cudaStreamDestroy(stream);
  cudaFree(dev);
  cudaFreeHost(host);
}
#endif

#if KILN_HAVE_CUDA
// The bulk weight upload's layout: tensors of one buffer within the gap and a multiple of 256
// bytes apart share a range (views of one another included, the gap copied with them); a far
// one, and one at another offset modulo 256 (a checkpoint's tensor behind a header of any
// length), start ranges of their own; every tensor lands 256-aligned on the device, at its
// place in its range.
TEST(Cuda, UploadLayoutMergesNearTensorsAndAlignsEachOnTheDevice) {
  Tensor buffer = Tensor::zeros(DType::kI8, {4 << 20});
  auto part = [&](int64_t begin, int64_t end) { return buffer.slice_rows(begin, end); };
  const int64_t far_at = 3 << 20;  // far past the gap, in the same mapping
  const std::vector<Tensor> hosts = {part(70144, 71000), part(far_at + 8, far_at + 3008),
                                     part(256, 1256),    part(768, 900),
                                     part(5120, 5123),   part(600, 700)};
  const cuda::UploadLayout l = cuda::plan_upload(hosts, /*max_gap=*/65536);
  const char* base = static_cast<const char*>(buffer.raw());
  // [256, 71000) of the buffer with four tensors, the misaligned view at 600, the far tensor.
  ASSERT_EQ(l.ranges.size(), 3u);
  auto range_of = [&](size_t i) -> const cuda::UploadLayout::Range& {
    const char* p = static_cast<const char*>(hosts[i].raw());
    for (const auto& r : l.ranges)
      if (p >= r.host && p + hosts[i].nbytes() <= r.host + r.bytes && (p - r.host) % 256 == 0)
        return r;
    ADD_FAILURE() << "tensor " << i << " is in no range";
    return l.ranges.front();
  };
  EXPECT_EQ(range_of(0).host, base + 256);
  EXPECT_EQ(range_of(0).bytes, 71000u - 256u);
  for (size_t i : {2u, 3u, 4u}) EXPECT_EQ(&range_of(i), &range_of(0)) << i;
  EXPECT_EQ(range_of(5).host, base + 600);
  EXPECT_EQ(range_of(5).bytes, 100u);
  EXPECT_EQ(range_of(1).host, base + far_at + 8);
  EXPECT_EQ(range_of(1).bytes, 3000u);
  size_t tensor_bytes = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const auto& r = range_of(i);
    const char* p = static_cast<const char*>(hosts[i].raw());
    EXPECT_EQ(l.device_offset[i], r.device_offset + static_cast<size_t>(p - r.host)) << i;
    EXPECT_EQ(l.device_offset[i] % 256, 0u) << i;
    EXPECT_LE(l.device_offset[i] + hosts[i].nbytes(), l.device_bytes) << i;
    tensor_bytes += hosts[i].nbytes();
  }
  EXPECT_EQ(l.tensor_bytes, tensor_bytes);
  // The ranges do not overlap on the device.
  for (size_t i = 0; i < l.ranges.size(); ++i)
    for (size_t j = i + 1; j < l.ranges.size(); ++j) {
      const auto& a = l.ranges[i];
      const auto& b = l.ranges[j];
      EXPECT_TRUE(a.device_offset + a.bytes <= b.device_offset ||
                  b.device_offset + b.bytes <= a.device_offset)
          << i << " " << j;
    }
  EXPECT_THROW(cuda::plan_upload(std::vector<Tensor>{Tensor()}), Error);
}

// The bulk upload copies every byte of every range, with chunks smaller than a range (a range's
// tail shorter than a chunk), more workers than chunks and one worker.
TEST(Cuda, BulkUploadCopiesEveryRange) {
  const CudaInfo info = query_cuda();
  if (info.device_count == 0)
    GTEST_SKIP() << "no GPU visible: " << (info.compiled ? info.error : "built without CUDA");
  Tensor buffer = Tensor::zeros(DType::kI8, {3 << 20});
  unsigned char* b = static_cast<unsigned char*>(buffer.raw());
  for (size_t i = 0; i < (3u << 20); ++i)
    b[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  const std::vector<Tensor> hosts = {buffer.slice_rows(17, 1000017),
                                     buffer.slice_rows(2 << 20, (2 << 20) + 777777)};
  const cuda::UploadLayout l = cuda::plan_upload(hosts, /*max_gap=*/4096);
  ASSERT_EQ(l.ranges.size(), 2u);
  for (const auto& [threads, chunk] :
       std::vector<std::pair<int, size_t>>{{1, 65536}, {3, 300000}, {64, 1 << 20}}) {
    void* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, l.device_bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(dev, 0, l.device_bytes), cudaSuccess);
    const cuda::UploadStats s = cuda::run_upload(l, dev, threads, chunk);
    EXPECT_EQ(s.copied_bytes, l.ranges[0].bytes + l.ranges[1].bytes);
    EXPECT_GE(s.threads, 1);
    EXPECT_LE(s.threads, threads);
    for (size_t i = 0; i < hosts.size(); ++i) {
      std::vector<unsigned char> got(hosts[i].nbytes());
      ASSERT_EQ(cudaMemcpy(got.data(), static_cast<char*>(dev) + l.device_offset[i], got.size(),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(0, std::memcmp(got.data(), hosts[i].raw(), got.size()))
          << "tensor " << i << ", " << threads << " threads, chunks of " << chunk;
    }
    cudaFree(dev);
  }
}
#endif

}  // namespace
}  // namespace kiln
