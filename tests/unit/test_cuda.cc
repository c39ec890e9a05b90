// CUDA is compiled whenever nvcc is found; these tests run on a machine with a GPU and are
// skipped, saying why, everywhere else.
#include <gtest/gtest.h>

#include "backend/cuda_info.h"

namespace kiln {
namespace {

TEST(Cuda, DeviceIsVisibleWhenPresent) {
  const CudaInfo info = query_cuda();
  if (!info.compiled) GTEST_SKIP() << "kiln was built without CUDA";
  if (info.device_count == 0) GTEST_SKIP() << "no GPU visible: " << info.error;
  EXPECT_FALSE(info.first_device.empty());
  EXPECT_NE(info.first_device.find("sm_"), std::string::npos) << info.first_device;
}

}  // namespace
}  // namespace kiln
