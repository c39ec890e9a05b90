// Plan files: round trip equality, no weight copy on load, refusal of other versions/devices,
// and corrupt or truncated files giving errors instead of crashes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "../models/model_runner.h"
#include "../models/parity_util.h"
#include "builder/builder.h"
#include "core/version.h"
#include "plan/plan.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

// ctest runs each test in its own process, in parallel: every process keeps its plans apart.
std::string tmp(const std::string& name) {
  return std::string(KILN_TEST_TMP) + "/plan_test_" + std::to_string(getpid()) + "/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Splits a plan into its header JSON and data section, and reassembles one after the header is
// edited (data offsets are relative to the data section, so they survive a header change).
struct PlanParts {
  std::string prefix;  // magic + version + reserved
  nlohmann::json header;
  std::string data;
};
PlanParts split_plan(const std::string& bytes) {
  PlanParts p;
  uint64_t len;
  std::memcpy(&len, bytes.data() + 16, 8);
  p.prefix = bytes.substr(0, 16);
  p.header = nlohmann::json::parse(bytes.substr(24, len));
  const size_t start = (24 + len + 63) / 64 * 64;
  p.data = bytes.substr(start);
  return p;
}
std::string join_plan(const PlanParts& p) {
  const std::string h = p.header.dump();
  const uint64_t len = h.size();
  std::string out = p.prefix;
  out.append(reinterpret_cast<const char*>(&len), 8);
  out += h;
  out.resize((out.size() + 63) / 64 * 64, '\0');
  return out + p.data;
}

class PlanTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::filesystem::create_directories(tmp(""));
    Logger quiet(LogLevel::kError);
    for (const char* m : {"t5-tiny", "bloom-tiny"}) {
      BuildOptions o;
      const ModelIR model = build_model(fixture(m), o, quiet);
      write_plan(tmp(std::string(m) + ".plan"), model, PlanBuildInfo{fixture(m), {}}, quiet);
    }
  }
  Context ctx_{ContextOptions{LogLevel::kError, 2}};
};

TEST_F(PlanTest, WeightsAreMappedNotCopiedAndAligned) {
  for (const char* m : {"t5-tiny", "bloom-tiny"}) {
    const ModelIR model = read_plan(tmp(std::string(m) + ".plan"), ctx_.log());
    int weights = 0;
    for (const Graph& g : model.graphs)
      for (const Value& v : g.values) {
        if (v.kind != ValueKind::kWeight) continue;
        ++weights;
        EXPECT_FALSE(v.data.owns_memory()) << v.name << " was copied";
        EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data.raw()) % 64, 0u) << v.name;
      }
    EXPECT_GT(weights, 10) << m;
  }
}

TEST_F(PlanTest, RunFromPlanEqualsRunFromCheckpoint) {
  for (const char* m : {"t5-tiny", "bloom-tiny"}) {
    auto from_dir = compile_model_dir(ctx_, fixture(m));
    auto from_plan = CompiledModel::load_plan(ctx_, tmp(std::string(m) + ".plan"));
    const SafetensorsFile ref =
        SafetensorsFile::open(fixture(std::string(m) + "/reference.safetensors"));
    for (int c = 0; c < 9; ++c) {
      const std::string k = "case" + std::to_string(c);
      const std::vector<int64_t> prompt = ids_of(ref.tensors().at(k + ".input_ids"));
      std::vector<int64_t> seq = ids_of(ref.tensors().at(k + ".greedy_ids"));
      seq.pop_back();
      const Forward a = run_forward(*from_dir, prompt, seq, false);
      const Forward b = run_forward(*from_plan, prompt, seq, false);
      ASSERT_EQ(a.logits.nbytes(), b.logits.nbytes());
      EXPECT_EQ(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.nbytes()), 0) << m << " " << k;
      GenerationParams p;
      p.num_beams = c % 2 ? 4 : 1;
      Scheduler ga(*from_dir), gb(*from_plan);
      EXPECT_EQ(ga.generate({prompt}, p)[0].output_ids, gb.generate({prompt}, p)[0].output_ids)
          << m << " " << k;
    }
    // The tokenizer travels inside the plan.
    EXPECT_EQ(from_plan->tokenizer().encode("reverse: suvogi"),
              from_dir->tokenizer().encode("reverse: suvogi"));
  }
}

TEST_F(PlanTest, MetadataRecordsBuild) {
  const nlohmann::json h = nlohmann::json::parse(read_plan_metadata_json(tmp("t5-tiny.plan")));
  EXPECT_EQ(h.at("device"), "cpu");
  EXPECT_EQ(h.at("precision"), "f32");
  EXPECT_EQ(h.at("kiln_version"), version_string());
  EXPECT_EQ(h.at("architecture"), "t5");
  EXPECT_TRUE(h.contains("profiles"));
}

void expect_plan_error(const std::string& path, const std::string& needle) {
  try {
    read_plan(path, Logger(LogLevel::kSilent));
    ADD_FAILURE() << "plan " << path << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(PlanTest, BadInputOtherFormatVersionIsRefused) {
  std::string bytes = slurp(tmp("t5-tiny.plan"));
  const uint32_t v2 = kPlanFormatVersion + 1;
  std::memcpy(bytes.data() + 8, &v2, 4);
  spit(tmp("v2.plan"), bytes);
  expect_plan_error(tmp("v2.plan"), "rebuild the plan");
}

TEST_F(PlanTest, BadInputOtherDeviceIsRefused) {
  PlanParts p = split_plan(slurp(tmp("bloom-tiny.plan")));
  p.header["device"] = "cuda";
  spit(tmp("cuda.plan"), join_plan(p));
  expect_plan_error(tmp("cuda.plan"), "built for device 'cuda'");
}

TEST_F(PlanTest, BadInputNotAPlan) {
  spit(tmp("empty.plan"), "");
  expect_plan_error(tmp("empty.plan"), "not a kiln plan");
  spit(tmp("magic.plan"), std::string(100, 'x'));
  expect_plan_error(tmp("magic.plan"), "bad magic");
  expect_plan_error(tmp("does-not-exist.plan"), "does-not-exist.plan");
}

TEST_F(PlanTest, BadInputTruncatedAnywhere) {
  const std::string bytes = slurp(tmp("bloom-tiny.plan"));
  // Cut inside the fixed header, the JSON header, the tokenizer and the weights.
  for (size_t cut :
       {size_t{5}, size_t{20}, size_t{200}, size_t{5000}, bytes.size() / 2, bytes.size() - 1}) {
    spit(tmp("cut.plan"), bytes.substr(0, cut));
    EXPECT_THROW(read_plan(tmp("cut.plan"), Logger(LogLevel::kSilent)), Error) << "cut at " << cut;
  }
}

TEST_F(PlanTest, BadInputBlobOutOfRange) {
  PlanParts p = split_plan(slurp(tmp("t5-tiny.plan")));
  p.header["blobs"][3]["offset"] = p.data.size();
  spit(tmp("blob.plan"), join_plan(p));
  expect_plan_error(tmp("blob.plan"), "past the end");
  p = split_plan(slurp(tmp("t5-tiny.plan")));
  p.header["blobs"][2]["bytes"] = 12;
  spit(tmp("blob2.plan"), join_plan(p));
  expect_plan_error(tmp("blob2.plan"), "needs");
}

TEST_F(PlanTest, BadInputGraphTampering) {
  // Bind an attention op to a cache layer that does not exist: refused before any kernel runs.
  PlanParts p = split_plan(slurp(tmp("bloom-tiny.plan")));
  for (auto& node : p.header["graphs"][0]["nodes"])
    if (node["op"] == "Attention") node["attrs"]["attention"]["layer"] = 99;
  spit(tmp("layer.plan"), join_plan(p));
  EXPECT_THROW(CompiledModel::load_plan(ctx_, tmp("layer.plan")), Error);
  p = split_plan(slurp(tmp("bloom-tiny.plan")));
  p.header["graphs"][0]["nodes"][4]["inputs"][0] = 100000;
  spit(tmp("ids.plan"), join_plan(p));
  expect_plan_error(tmp("ids.plan"), "refers to value");
  p = split_plan(slurp(tmp("bloom-tiny.plan")));
  p.header["graphs"][0]["nodes"][2]["op"] = "Conv3D";
  spit(tmp("op.plan"), join_plan(p));
  expect_plan_error(tmp("op.plan"), "unknown op 'Conv3D'");
}

// Random single-byte corruptions of the header: every outcome is an error or a plan that loads
// and runs — never a crash (this test runs under AddressSanitizer in `make test`).
TEST_F(PlanTest, BadInputRandomHeaderCorruption) {
  const std::string bytes = slurp(tmp("bloom-tiny.plan"));
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data() + 16, 8);
  std::mt19937 rng(1234);
  int refused = 0, loaded = 0;
  for (int trial = 0; trial < 60; ++trial) {
    std::string b = bytes;
    const size_t pos = 24 + rng() % header_len;
    b[pos] = static_cast<char>("0123456789:,\"{}[]ax-"[rng() % 20]);
    spit(tmp("fuzz.plan"), b);
    try {
      auto engine = CompiledModel::load_plan(ctx_, tmp("fuzz.plan"));
      Scheduler gen(*engine);
      GenerationParams p;
      p.max_new_tokens = 3;
      gen.generate({{291, 403, 89}}, p);
      ++loaded;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_EQ(refused + loaded, 60);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace kiln::test
