// Devices carry an ordinal (which GPU) beside their kind; plans and kernel registries name the
// kind. Backends describe the options they run with (`kiln inspect --device`, `kiln bench -v`).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "../scoped_env.h"
#include "backend/backend.h"
#include "backend/cuda_info.h"

namespace kiln {
namespace {

TEST(Device, KindComparisonIgnoresTheOrdinalAndDeviceComparisonDoesNot) {
  const Device gpu0 = Device::kCuda;
  const Device gpu1(Device::kCuda, 1);
  EXPECT_EQ(gpu0.ordinal, 0);
  EXPECT_TRUE(gpu1 == Device::kCuda) << "a kind matches every device of it";
  EXPECT_FALSE(gpu1 == Device::kCpu);
  EXPECT_FALSE(gpu0 == gpu1) << "two GPUs are two devices";
  EXPECT_TRUE(gpu1 == Device(Device::kCuda, 1));
  EXPECT_LT(gpu0, gpu1);
  EXPECT_EQ(device_name(gpu1), "cuda");
  EXPECT_EQ(device_label(gpu1), "cuda:1");
  EXPECT_EQ(device_label(Device::kCpu), "cpu");
  Device parsed;
  ASSERT_TRUE(parse_device("cuda", &parsed));
  EXPECT_EQ(parsed, Device(Device::kCuda, 0));
}

TEST(BackendOptions, CpuBackendDescribesItsContextsSwitches) {
  const test::ScopedEnv threads("KILN_NUM_THREADS", "1");
  Context ctx(options_from_environment());
  auto cpu = make_cpu_backend(ctx);
  const std::vector<BackendOption> options = cpu->options();
  auto value = [&](const std::string& variable) {
    auto it = std::find_if(options.begin(), options.end(),
                           [&](const BackendOption& o) { return o.variable == variable; });
    return it == options.end() ? std::string("(missing)") : it->value;
  };
  EXPECT_EQ(value("KILN_NUM_THREADS"), "1");
  EXPECT_EQ(value("KILN_CPU_ISA"), std::string(cpu_isa_name(ctx.cpu_isa())));
  EXPECT_EQ(value("KILN_CPU_BF16_DOT"), ctx.cpu_bf16_dot() ? "on" : "off");
  for (const BackendOption& o : options) EXPECT_FALSE(o.meaning.empty()) << o.variable;
}

// The host selection every backend without kernels of its own uses (the reference's).
TEST(TokenSelector, HostDefaultsGatherAndEditOnTheHost) {
  TokenSelector host;
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{7, 8, 9}, {3});
  const std::vector<int64_t> keep = {2, 0}, tail = {5};
  const Tensor gathered = host.gather_ids(ids, keep, tail);
  ASSERT_EQ(gathered.numel(), 3);
  EXPECT_EQ(gathered.data<int64_t>()[0], 9);
  EXPECT_EQ(gathered.data<int64_t>()[1], 7);
  EXPECT_EQ(gathered.data<int64_t>()[2], 5);
  std::vector<int64_t> out(1);
  const Tensor logits = Tensor::from_vector(std::vector<float>{0.f, 2.f, 1.f}, {1, 3});
  EXPECT_FALSE(host.argmax_rows(logits, out)) << "no kernel: the caller reads the logits";
  EXPECT_EQ(host.max_top_k(), 0);
  Tensor edited = logits.clone();
  RowEdit ban;
  ban.banned = {1};
  host.edit_logits_rows(edited, std::span<const RowEdit>(&ban, 1));
  EXPECT_TRUE(std::isinf(edited.data<float>()[1]));
  EXPECT_EQ(edited.data<float>()[2], 1.f);
}

TEST(CudaDevices, ABackendIsMadeForEachGpuAndNoOther) {
  const CudaInfo info = query_cuda();
  if (info.device_count == 0) GTEST_SKIP() << "no GPU visible";
  Context ctx(ContextOptions{LogLevel::kError, 1});
  for (int ordinal = 0; ordinal < info.device_count; ++ordinal) {
    auto backend = make_backend(ctx, Device(Device::kCuda, ordinal));
    EXPECT_EQ(backend->device(), Device(Device::kCuda, ordinal));
    const Tensor host = Tensor::from_vector(std::vector<float>{1.f, 2.f, 3.f}, {3});
    const Tensor on_gpu = backend->allocator().upload(host);
    EXPECT_EQ(on_gpu.device(), Device(Device::kCuda, ordinal)) << "its memory is that GPU's";
    const Tensor back = backend->allocator().to_host(on_gpu);
    EXPECT_EQ(back.data<float>()[2], 3.f);
    EXPECT_FALSE(backend->options().empty());
  }
  try {
    make_cuda_backend(ctx, info.device_count);
    ADD_FAILURE() << "a backend for GPU " << info.device_count << " of " << info.device_count;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:" + std::to_string(info.device_count)),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
