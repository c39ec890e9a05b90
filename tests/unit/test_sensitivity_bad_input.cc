// Bad values for the sensitivity fallback (builder/sensitivity.h) and its record in the
// calibration cache: each refused with a message naming the option or the file and line, never
// a crash (this suite runs under AddressSanitizer).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "builder/sensitivity.h"
#include "passes/calibration_cache.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

std::string write_file(const std::string& name, const std::string& bytes) {
  fs::create_directories(KILN_TEST_TMP);
  const std::string path = std::string(KILN_TEST_TMP) + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// The message of the error `f` throws, and its kind; fails the test when nothing is thrown.
std::string error_of(const std::function<void()>& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  ADD_FAILURE() << "nothing was thrown";
  return "";
}

void expect_has(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(SensitivityBadInput, ToleranceValuesAreParsedOrRefusedNamingTheOption) {
  EXPECT_EQ(parse_quant_tolerance("0.001"), 0.001);
  EXPECT_EQ(parse_quant_tolerance("1e-3"), 1e-3);
  EXPECT_EQ(parse_quant_tolerance("0"), 0.0);
  EXPECT_EQ(parse_quant_tolerance("off"), std::nullopt);
  for (const char* bad :
       {"-0.5", "-1e-9", "nan", "inf", "-inf", "", "abc", "0.01x", "1,5", "OFF", " 0.1"}) {
    ErrorKind kind = ErrorKind::kRuntime;
    const std::string m = error_of([&] { parse_quant_tolerance(bad); }, &kind);
    expect_has(m, "--quant-tolerance");
    EXPECT_EQ(kind, ErrorKind::kUsage) << bad;
  }
  expect_has(error_of([] { parse_quant_tolerance("-0.5"); }), ">= 0");
}

TEST(SensitivityBadInput, PromptAndTokenCountsMustBePositive) {
  SensitivityOptions o;
  check_sensitivity_options(o);  // the defaults are valid
  o.prompts = 0;
  expect_has(error_of([&] { check_sensitivity_options(o); }), "--sensitivity-prompts 0");
  o.prompts = -4;
  expect_has(error_of([&] { check_sensitivity_options(o); }), "--sensitivity-prompts -4");
  o.prompts = 1;
  o.new_tokens = 0;
  expect_has(error_of([&] { check_sensitivity_options(o); }), "at least 1 generated token");
  o.new_tokens = 1;
  o.tolerance = -1.0;
  expect_has(error_of([&] { check_sensitivity_options(o); }), "--quant-tolerance");
}

// The fallback measures calibrated int8 builds only, and is refused before any work otherwise.
TEST(SensitivityBadInput, OnlyCalibratedInt8BuildsAreMeasured) {
  Context ctx(ContextOptions{LogLevel::kSilent, 1});
  const std::vector<CalibrationPrompt> prompts = {{"reverse: ab", "test:1"}};
  BuildOptions o;  // fp32
  std::string m = error_of([&] {
    apply_sensitivity_fallback(ctx, "/nonexistent/model", o, prompts, SensitivityOptions{});
  });
  expect_has(m, "--precision fp32");
  o.precision = Precision::kInt8;
  m = error_of([&] {
    apply_sensitivity_fallback(ctx, "/nonexistent/model", o, prompts, SensitivityOptions{});
  });
  expect_has(m, "without a calibration");
  o.precision_options.calibration = CalibrationCache{};
  m = error_of(
      [&] { apply_sensitivity_fallback(ctx, "/nonexistent/model", o, {}, SensitivityOptions{}); });
  expect_has(m, "needs calibration prompts");
  SensitivityOptions bad;
  bad.tolerance = -0.1;
  m = error_of([&] { apply_sensitivity_fallback(ctx, "/nonexistent/model", o, prompts, bad); });
  expect_has(m, "--quant-tolerance");
}

// Version 3 caches: the header's quant-tolerance and the 'float' lines, every malformed one
// named by line; a round trip keeps every value.
TEST(SensitivityBadInput, MalformedFallbackLinesInACacheNameTheLine) {
  const std::string header =
      "kiln-calibration-cache 3 model=00000000000000aa method=entropy quant-tolerance=0.005\n";
  struct Case {
    std::string bytes, expected;
  };
  const Case cases[] = {
      {"kiln-calibration-cache 3 model=00000000000000aa method=entropy\n", ":1"},
      {"kiln-calibration-cache 3 model=00 method=entropy quant-tolerance=-1\n", "quant-tolerance"},
      {"kiln-calibration-cache 3 model=00 method=entropy quant-tolerance=nan\n", "quant-tolerance"},
      {"kiln-calibration-cache 3 model=00 method=entropy quant-tolerance=1 colour=red\n", "colour"},
      {"kiln-calibration-cache 3 model=00 method=entropy quant-tolerance=1 quant-tolerance=2\n",
       "twice"},
      {"kiln-calibration-cache 1 model=00 method=entropy quant-tolerance=1\n", "version 1"},
      {"kiln-calibration-cache 1 model=00000000000000aa method=entropy\nfloat a 0.1 0.9\n",
       "without quant-tolerance"},
      {header + "float a 0.1\n", ":2"},
      {header + "float a 0.1 0.9 7\n", ":2"},
      {header + "float a -0.1 0.9\n", ":2"},
      {header + "float a 0.1 1.5\n", ":2"},
      {header + "float a nan 0.5\n", ":2"},
      {header + "float a 0.1 0.9\nfloat a 0.2 0.8\n", "twice"},
  };
  for (const Case& c : cases) {
    const std::string path = write_file("sens_bad.cache", c.bytes);
    const std::string m = error_of([&] { read_calibration_cache(path); });
    expect_has(m, c.expected);
    expect_has(m, path);
  }
  CalibrationCache cache;
  cache.model = "00000000000000aa";
  cache.method = "entropy";
  cache.scales = {{"encoder/x", 0.25f}};
  cache.quant_tolerance = 0.005;
  cache.fallback = {{"encoder.block.0.qkv", {0.0123456789, 0.975}}, {"lm_head", {0.0, 1.0}}};
  const std::string path = std::string(KILN_TEST_TMP) + "/sens_roundtrip.cache";
  write_calibration_cache(path, cache);
  EXPECT_EQ(read_calibration_cache(path), cache);
  // A tolerance of 0 (keep every measurable layer) and no layers kept are both version 3.
  cache.quant_tolerance = 0.0;
  cache.fallback.clear();
  write_calibration_cache(path, cache);
  EXPECT_EQ(read_calibration_cache(path), cache);
  // Kept layers without a tolerance cannot be written.
  cache.quant_tolerance = -1.0;
  cache.fallback = {{"lm_head", {0.1, 0.5}}};
  expect_has(error_of([&] { write_calibration_cache(path, cache); }), "without a tolerance");
}

}  // namespace
}  // namespace kiln::test
