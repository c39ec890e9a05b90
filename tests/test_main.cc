#include <gtest/gtest.h>

#include <filesystem>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  std::filesystem::create_directories(KILN_TEST_TMP);
  return RUN_ALL_TESTS();
}
