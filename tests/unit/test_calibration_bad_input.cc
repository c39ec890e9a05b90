// Bad calibration inputs are refused naming what is wrong and where: `--calib` prompt files
// (io/calibration_prompts.h) and calibration caches (passes/calibration_cache.h). Suite
// CalibBadInput: `make asan` runs every test whose name holds "BadInput" under ASan/UBSan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "io/calibration_prompts.h"
#include "passes/calibration_cache.h"

namespace kiln::test {
namespace {

std::string write_file(const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(KILN_TEST_TMP);
  const std::string path = std::string(KILN_TEST_TMP) + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// The error's message; fails the test when nothing (or something else) was thrown.
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

void expect_has(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(CalibBadInput, PromptsAreReadFromTextPromptOrStringLines) {
  const std::string path = write_file(
      "calib_ok.jsonl", "{\"prompt\": \"reverse: ab\"}\n\n{\"text\": \"caf\xc3\xa9\"}\n\"x\"\n");
  const std::vector<CalibrationPrompt> p = read_calibration_prompts(path);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].text, "reverse: ab");
  EXPECT_EQ(p[1].text, "caf\xc3\xa9");
  EXPECT_EQ(p[1].origin, path + ":3");
  EXPECT_EQ(p[2].text, "x");
}

TEST(CalibBadInput, EmptyPromptFilesAreRefused) {
  for (const char* bytes : {"", "\n  \n\t\n"}) {
    const std::string path = write_file("calib_empty.jsonl", bytes);
    const std::string m = error_of([&] { read_calibration_prompts(path); });
    expect_has(m, path);
    expect_has(m, "no calibration prompts");
  }
}

TEST(CalibBadInput, ALineThatIsNotJsonIsNamed) {
  const std::string path = write_file("calib_notjson.jsonl", "{\"text\": \"a\"}\nreverse: ab\n");
  const std::string m = error_of([&] { read_calibration_prompts(path); });
  expect_has(m, path + ":2");
  expect_has(m, "not valid JSON");
}

TEST(CalibBadInput, ALineThatIsNotUtf8IsNamed) {
  const std::string path = write_file(
      "calib_latin1.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": \"caf\xe9\"}\n");
  const std::string m = error_of([&] { read_calibration_prompts(path); });
  expect_has(m, path + ":3");
  expect_has(m, "UTF-8");
}

TEST(CalibBadInput, ALineWithoutTheFieldIsNamed) {
  for (const char* line :
       {"{\"task\": \"add\", \"answer\": \"3\"}", "{\"text\": 3}", "[\"a\"]", "{\"text\": \"\"}"}) {
    const std::string path = write_file("calib_nofield.jsonl", std::string("\"ok\"\n") + line);
    const std::string m = error_of([&] { read_calibration_prompts(path); });
    expect_has(m, path + ":2");
  }
  const std::string m = error_of([] { read_calibration_prompts("/nonexistent/calib.jsonl"); });
  expect_has(m, "/nonexistent/calib.jsonl");
}

CalibrationCache small_cache() {
  CalibrationCache c;
  c.model = "00000000000000aa";
  c.method = "entropy";
  c.scales = {{"encoder/a", 0.5f}, {"decoder/b", 0.25f}};
  return c;
}

TEST(CalibBadInput, ACacheOfAnotherModelIsRefusedNamingBothFingerprints) {
  const std::string m = error_of([] {
    check_calibration_cache(small_cache(), "x.cache", "00000000000000bb",
                            {"encoder/a", "decoder/b"});
  });
  expect_has(m, "x.cache");
  expect_has(m, "00000000000000aa");
  expect_has(m, "00000000000000bb");
}

TEST(CalibBadInput, ACacheWithMissingOrExtraTensorsIsRefusedNamingThem) {
  const CalibrationCache c = small_cache();
  std::string m = error_of([&] {
    check_calibration_cache(c, "x.cache", c.model, {"encoder/a", "decoder/b", "decoder/c"});
  });
  expect_has(m, "missing decoder/c");
  m = error_of([&] { check_calibration_cache(c, "x.cache", c.model, {"encoder/a"}); });
  expect_has(m, "not in the model decoder/b");
}

TEST(CalibBadInput, MalformedCacheFilesNameTheLine) {
  const std::string header = "kiln-calibration-cache 1 model=00000000000000aa method=entropy\n";
  struct Case {
    std::string bytes, expected;
  };
  const Case cases[] = {
      {"", "is empty"},
      {"hello world\n", ":1"},
      {"kiln-calibration-cache 9 model=00 method=entropy\n", "version 9"},
      {"kiln-calibration-cache 1 model=00\n", ":1"},
      {header + "encoder/a 0.5\nencoder/b\n", ":3"},
      {header + "encoder/a 0.5 7\n", ":2"},
      {header + "encoder/a nan\n", ":2"},
      {header + "encoder/a -1\n", ":2"},
      {header + "encoder/a 0x1p-3\n", ":2"},
      {header + "encoder/a 0.5\nencoder/a 0.5\n", "listed twice"},
      // Version 4 is AWQ's: method=awq with 'smooth' lines only, and method=awq nowhere else.
      {"kiln-calibration-cache 4 model=00 method=entropy\n", "version 4 is method=awq's"},
      {"kiln-calibration-cache 1 model=00 method=awq\n", "method=awq in a version 1"},
      {"kiln-calibration-cache 4 model=00 method=awq\nencoder/a 0.5\n", "'smooth TENSOR F0"},
      {"kiln-calibration-cache 4 model=00 method=awq\nsmooth encoder/a 0\n", ":2"},
  };
  for (const Case& c : cases) {
    const std::string path = write_file("calib_bad.cache", c.bytes);
    const std::string m = error_of([&] { read_calibration_cache(path); });
    expect_has(m, c.expected);
    expect_has(m, path);
  }
  const std::string path = write_file("calib_crlf.cache", header + "encoder/a 0.5\r\n");
  EXPECT_EQ(read_calibration_cache(path).scales.at("encoder/a"), 0.5f);
}

}  // namespace
}  // namespace kiln::test
