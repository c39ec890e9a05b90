// Plan files: round trip equality, no weight copy on load, refusal of other versions/devices,
// and corrupt or truncated files giving errors instead of crashes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "../models/model_runner.h"
#include "../models/parity_util.h"
#include "backend/cuda_info.h"
#include "builder/builder.h"
#include "core/cpu_features.h"
#include "core/version.h"
#include "graph/packing.h"
#include "io/hash.h"
#include "plan/plan.h"
#include "runtime/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace kiln::test {
namespace {

// ctest runs each test in its own process, in parallel: every process keeps its plans apart,
// and removes them when it exits (hundreds of runs' plans, ~350 MB each, filled the disk).
std::string process_dir() {
  return std::string(KILN_TEST_TMP) + "/plan_test_" + std::to_string(getpid());
}
std::string tmp(const std::string& name) { return process_dir() + "/" + name; }
struct RemovePlansAtExit {
  ~RemovePlansAtExit() {
    std::error_code ec;
    std::filesystem::remove_all(process_dir(), ec);
  }
};
const RemovePlansAtExit remove_plans_at_exit;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Splits a plan into its header JSON and data section, and reassembles one after the header is
// edited (data offsets are relative to the data section, so they survive a header change). The
// reassembled plan carries a valid checksum, as a crafted or buggy plan would, so that the checks
// behind the checksum are exercised; `resign = false` keeps the old checksum.
struct PlanParts {
  std::string prefix;  // magic + version + reserved
  uint64_t checksum = 0;
  nlohmann::json header;
  std::string data;
};
PlanParts split_plan(const std::string& bytes) {
  PlanParts p;
  uint64_t len;
  std::memcpy(&len, bytes.data() + 16, 8);
  std::memcpy(&p.checksum, bytes.data() + 24, 8);
  p.prefix = bytes.substr(0, 16);
  p.header = nlohmann::json::parse(bytes.substr(kPlanFixedHeader, len));
  const size_t start = (kPlanFixedHeader + len + 63) / 64 * 64;
  p.data = bytes.substr(start);
  return p;
}
std::string join_plan(const PlanParts& p, bool resign = true) {
  const std::string h = p.header.dump();
  const uint64_t len = h.size();
  const size_t tok = p.header["tokenizer"]["bytes"].get<size_t>();
  const uint64_t sum = resign ? hash64(p.data.data(), tok, hash64(h.data(), h.size())) : p.checksum;
  std::string out = p.prefix;
  out.append(reinterpret_cast<const char*>(&len), 8);
  out.append(reinterpret_cast<const char*>(&sum), 8);
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
  EXPECT_EQ(h.at("precision"), "fp32");
  EXPECT_EQ(h.at("kiln_version"), version_string());
  EXPECT_EQ(h.at("architecture"), "t5");
  EXPECT_EQ(h.at("profile").at("max_input_tokens"), 512);
  EXPECT_EQ(h.at("profile").at("token_buckets").back(), h.at("profile").at("max_step_tokens"));
  EXPECT_EQ(h.at("model").at("cache_layers"), 4);
  EXPECT_EQ(h.at("model").at("encoder_decoder"), true);
  EXPECT_EQ(h.at("kv_cache"), "auto");
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
  const uint32_t next = kPlanFormatVersion + 1;
  std::memcpy(bytes.data() + 8, &next, 4);
  spit(tmp("next.plan"), bytes);
  expect_plan_error(tmp("next.plan"), "rebuild the plan");
}

TEST_F(PlanTest, BadInputOtherDeviceIsRefused) {
  PlanParts p = split_plan(slurp(tmp("bloom-tiny.plan")));
  p.header["device"] = "cuda";
  spit(tmp("cuda.plan"), join_plan(p));
  if (query_cuda().device_count > 0) {
    // A machine with a GPU runs cuda plans (fp32 graphs run on either device).
    EXPECT_NO_THROW(CompiledModel::load_plan(ctx_, tmp("cuda.plan")));
  } else {
    // Issue 36: a runtime error (exit 1, not the usage error 2), naming the fix rather than the
    // CUDA runtime's words ("CUDA driver version is insufficient ...").
    try {
      CompiledModel::load_plan(ctx_, tmp("cuda.plan"));
      ADD_FAILURE() << "a cuda plan was accepted by a build or machine without CUDA";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(e.kind(), ErrorKind::kUsage) << what;
      EXPECT_NE(what.find("device cuda: "), std::string::npos) << what;
      EXPECT_NE(what.find("rebuild it with --device cpu"), std::string::npos) << what;
      if (query_cuda().compiled) {
        EXPECT_NE(what.find("no NVIDIA GPU/driver found (CUDA: "), std::string::npos) << what;
      }
    }
  }
  p.header["device"] = "tpu";
  spit(tmp("tpu.plan"), join_plan(p));
  expect_plan_error(tmp("tpu.plan"), "unknown device 'tpu'");
}

TEST_F(PlanTest, CudaPlansRecordTheirGpuArchitecture) {
  if (!query_cuda().compiled) GTEST_SKIP() << "built without CUDA";
  Logger quiet(LogLevel::kError);
  BuildOptions o;
  o.device = Device::kCuda;
  o.precision = Precision::kFp16;
  write_plan(tmp("arch.plan"), build_model(fixture("bloom-tiny"), o, quiet),
             PlanBuildInfo{fixture("bloom-tiny"), {}}, quiet);
  const std::string target = read_plan(tmp("arch.plan"), quiet).target;
  // The visible GPU's architecture, else the one the kernels were compiled for (sm_90 here).
  const CudaInfo info = query_cuda();
  EXPECT_EQ(target, "sm_" + std::to_string(info.first_sm > 0 ? info.first_sm : info.compiled_sm));
  EXPECT_EQ(target.rfind("sm_", 0), 0u) << target;
  // Plain CPU plans (this fixture's) run on any CPU of the device and name no target.
  EXPECT_FALSE(split_plan(slurp(tmp("bloom-tiny.plan"))).header.contains("target"));
}

// --kv-cache fp8: a cuda plan records it (and a plan read back keeps it, so the runtime sizes an
// E4M3 cache); a cpu build refuses it naming what runs it; a cpu plan whose header claims it, or
// an unknown kind, is refused when read.
TEST_F(PlanTest, BadInputKvCacheTheDeviceCannotKeepIsRefused) {
  Logger quiet(LogLevel::kError);
  BuildOptions o;
  o.kv_cache = KvCache::kFp8;
  try {
    build_model(fixture("bloom-tiny"), o, quiet);
    ADD_FAILURE() << "a cpu build kept an fp8 KV cache";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find("--device cpu --kv-cache fp8: "), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
  }
  if (query_cuda().compiled) {
    o.device = Device::kCuda;
    o.precision = Precision::kFp16;
    write_plan(tmp("kv8.plan"), build_model(fixture("bloom-tiny"), o, quiet),
               PlanBuildInfo{fixture("bloom-tiny"), {}}, quiet);
    EXPECT_EQ(read_plan(tmp("kv8.plan"), quiet).kv_cache, KvCache::kFp8);
    EXPECT_EQ(split_plan(slurp(tmp("kv8.plan"))).header.at("kv_cache"), "fp8");
  }
  PlanParts p = split_plan(slurp(tmp("bloom-tiny.plan")));
  p.header["kv_cache"] = "fp8";
  spit(tmp("cpu-kv8.plan"), join_plan(p));
  expect_plan_error(tmp("cpu-kv8.plan"), "a cpu plan with kv_cache fp8: ");
  p.header["kv_cache"] = "int3";
  spit(tmp("kv3.plan"), join_plan(p));
  expect_plan_error(tmp("kv3.plan"), "unknown kv_cache 'int3' (known: auto, fp8)");
  // Plans written before --kv-cache have no entry: the attention's own type.
  p.header.erase("kv_cache");
  spit(tmp("kv-old.plan"), join_plan(p));
  EXPECT_EQ(read_plan(tmp("kv-old.plan"), quiet).kv_cache, KvCache::kAuto);
}

// kiln build --max-step-tokens: the profile's step size, never below the longest prompt; the
// batch fits in a step; cuda plans default to kCudaStepTokens.
TEST_F(PlanTest, StepTokensShapeTheProfile) {
  Logger quiet(LogLevel::kError);
  BuildOptions o;
  o.max_input_tokens = 64;
  o.max_step_tokens = 1000;
  ShapeProfile p = build_model(fixture("bloom-tiny"), o, quiet).profile;
  EXPECT_EQ(p.max_step_tokens, 1000);
  EXPECT_EQ(p.token_buckets.back(), 1000);
  EXPECT_EQ(p.max_batch, 256);
  o.max_step_tokens = 8;  // below the longest prompt: raised to it; the batch to the step
  p = build_model(fixture("bloom-tiny"), o, quiet).profile;
  EXPECT_EQ(p.max_step_tokens, 64);
  EXPECT_EQ(p.max_batch, 64);
  o.max_step_tokens = -1;
  EXPECT_THROW(build_model(fixture("bloom-tiny"), o, quiet), Error);
  if (query_cuda().compiled) {
    BuildOptions cuda;
    cuda.device = Device::kCuda;
    cuda.max_input_tokens = 64;
    EXPECT_EQ(build_model(fixture("bloom-tiny"), cuda, quiet).profile.max_step_tokens,
              kCudaStepTokens);
  }
}

TEST_F(PlanTest, BadInputPlanForAnotherTargetIsRefused) {
  PlanParts p = split_plan(slurp(tmp("bloom-tiny.plan")));
  p.header["target"] = "sm_75";
  spit(tmp("other-target.plan"), join_plan(p));
  // A CPU backend runs no sm_75 plan; on a GPU machine a cuda plan for another architecture is
  // refused the same way.
  auto expect_refused = [&](const std::string& path) {
    try {
      CompiledModel::load_plan(ctx_, path);
      ADD_FAILURE() << "plan " << path << " for sm_75 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the plan was built for sm_75"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("rebuild it on this machine"), std::string::npos)
          << e.what();
    }
  };
  expect_refused(tmp("other-target.plan"));
  if (query_cuda().device_count > 0 && query_cuda().first_sm != 75) {
    p.header["device"] = "cuda";
    spit(tmp("other-target-cuda.plan"), join_plan(p));
    expect_refused(tmp("other-target-cuda.plan"));
  }
}

// CPU plans built for AVX-512 store their Linear weights packed (panel16) and record the ISA;
// they load without copying, and run exactly like the plain plan (whose weights the same kernel
// packs at load).
TEST_F(PlanTest, CpuPlansPackedForAvx512RecordTheirTarget) {
  if (best_cpu_isa(detect_cpu_features()) != CpuIsa::kAvx512) GTEST_SKIP() << "no AVX-512 here";
  Logger quiet(LogLevel::kError);
  for (const char* m : {"t5-tiny", "bloom-tiny"}) {
    BuildOptions o;
    o.pack_for_cpu = CpuIsa::kAvx512;
    const std::string path = tmp(std::string(m) + "-packed.plan");
    write_plan(path, build_model(fixture(m), o, quiet), PlanBuildInfo{fixture(m), {}}, quiet);
    const ModelIR model = read_plan(path, quiet);
    EXPECT_EQ(model.target, "avx512") << m;
    int packed = 0;
    for (const Graph& g : model.graphs)
      for (const Node& n : g.nodes)
        if (n.op == OpKind::kLinear) {
          const Value& w = g.values[n.inputs[1]];
          EXPECT_EQ(w.layout, panel16_layout()) << w.name;
          EXPECT_FALSE(w.data.owns_memory()) << w.name << " was copied";
          ++packed;
        }
    EXPECT_GT(packed, 10) << m;
    // Same logits, bit for bit, and the same ids as the plain plan.
    auto plain = CompiledModel::load_plan(ctx_, tmp(std::string(m) + ".plan"));
    auto fast = CompiledModel::load_plan(ctx_, path);
    const SafetensorsFile ref =
        SafetensorsFile::open(fixture(std::string(m) + "/reference.safetensors"));
    for (int c = 0; c < 3; ++c) {
      const std::string k = "case" + std::to_string(c);
      const std::vector<int64_t> prompt = ids_of(ref.tensors().at(k + ".input_ids"));
      std::vector<int64_t> seq = ids_of(ref.tensors().at(k + ".greedy_ids"));
      seq.pop_back();
      const Forward a = run_forward(*plain, prompt, seq, false);
      const Forward b = run_forward(*fast, prompt, seq, false);
      ASSERT_EQ(a.logits.nbytes(), b.logits.nbytes());
      EXPECT_EQ(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.nbytes()), 0) << m << " " << k;
    }
  }
}

// A plan packed for AVX-512 on a CPU (or a context) running AVX2 kernels is refused naming both
// instruction sets; so are a plan for an ISA this kiln does not know and a blob in a packing it
// has no kernel for.
TEST_F(PlanTest, BadInputPlanPackedForAnotherIsaIsRefused) {
  Logger quiet(LogLevel::kError);
  BuildOptions o;
  o.pack_for_cpu = CpuIsa::kAvx512;
  const std::string path = tmp("bloom-packed.plan");
  write_plan(path, build_model(fixture("bloom-tiny"), o, quiet),
             PlanBuildInfo{fixture("bloom-tiny"), {}}, quiet);
  auto expect_refused = [&](Context& ctx, const std::string& plan,
                            const std::vector<std::string>& needles) {
    try {
      CompiledModel::load_plan(ctx, plan);
      ADD_FAILURE() << "plan " << plan << " was accepted";
    } catch (const Error& e) {
      for (const std::string& needle : needles)
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  ContextOptions avx2{LogLevel::kError, 2};
  avx2.cpu_isa = CpuIsa::kAvx2;
  Context ctx2(avx2);
  expect_refused(ctx2, path, {"built for avx512", "avx2", "rebuild it on this machine"});

  PlanParts p = split_plan(slurp(path));
  p.header["target"] = "amx";
  spit(tmp("amx.plan"), join_plan(p));
  expect_refused(ctx_, tmp("amx.plan"), {"built for amx", "rebuild it on this machine"});

  // A packed blob in a plain plan (no target): the CPU backend still checks each weight.
  p = split_plan(slurp(path));
  p.header.erase("target");
  spit(tmp("untargeted.plan"), join_plan(p));
  expect_refused(ctx2, tmp("untargeted.plan"), {"packed as panel16 for avx512", "avx2 kernels"});

  p = split_plan(slurp(path));
  for (auto& b : p.header["blobs"])
    if (b["layout"]["kind"] == "packed") b["layout"]["packing"] = "panel32";
  spit(tmp("panel32.plan"), join_plan(p));
  expect_plan_error(tmp("panel32.plan"), "packed as 'panel32' for avx512");
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
    if (node["op"] == "Attention") node["attrs"]["layer"] = 99;
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

// Any edit of the header or the tokenizer after the build is caught by the checksum: a plan
// whose tokenizer was edited by hand used to load and print empty text.
TEST_F(PlanTest, BadInputEditedHeaderOrTokenizerFailsTheChecksum) {
  const std::string bytes = slurp(tmp("bloom-tiny.plan"));
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data() + 16, 8);
  const size_t data = (kPlanFixedHeader + header_len + 63) / 64 * 64;
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    std::string b = bytes;
    // Half the trials in the header, half in the tokenizer (at data offset 0).
    const size_t pos = trial % 2 ? kPlanFixedHeader + rng() % header_len : data + rng() % 5000;
    b[pos] = static_cast<char>(b[pos] ^ (1 + rng() % 255));
    spit(tmp("edited.plan"), b);
    try {
      read_plan(tmp("edited.plan"), Logger(LogLevel::kSilent));
      ADD_FAILURE() << "edit at byte " << pos << " was accepted";
    } catch (const Error& e) {
      // A flipped byte may also break the JSON or the fixed header first; all are refusals.
      const std::string msg = e.what();
      EXPECT_TRUE(msg.find("checksum") != std::string::npos ||
                  msg.find("corrupt plan") != std::string::npos)
          << "byte " << pos << ": " << msg;
    }
  }
}

// A plan whose tokenizer extent was cut to 100 bytes, the checksum recomputed as the reader
// computes it (so the checksum passes): the first pieces of the SentencePiece model still parse
// as a small model, which used to load and run without a word. The header's piece count refuses
// it when the tokenizer is made, on load and in `kiln tokenize --plan`'s path alike.
TEST_F(PlanTest, BadInputTokenizerCutBehindTheChecksumIsRefused) {
  PlanParts p = split_plan(slurp(tmp("t5-tiny.plan")));
  ASSERT_EQ(p.header["tokenizer"]["format"], "sentencepiece");
  const int64_t pieces = p.header["tokenizer"]["pieces"].get<int64_t>();
  EXPECT_EQ(pieces, load_tokenizer_dir(fixture("t5-tiny"))->vocab_size());
  p.header["tokenizer"]["bytes"] = 100;
  spit(tmp("cut-tokenizer.plan"), join_plan(p));
  // The plan itself reads (the checksum is right), with the cut bytes and the recorded count.
  const ModelIR model = read_plan(tmp("cut-tokenizer.plan"), Logger(LogLevel::kSilent));
  ASSERT_EQ(model.tokenizer_bytes.size(), 100u);
  EXPECT_EQ(model.tokenizer_pieces, pieces);
  // Made from those 100 bytes, the tokenizer is a smaller one: the check, not the parser, refuses.
  const int64_t cut =
      make_tokenizer(TokenizerKind::kSentencePiece, model.tokenizer_bytes, "cut")->vocab_size();
  EXPECT_LT(cut, pieces);
  const std::string want = fmt::format(
      "the sentencepiece tokenizer made from the plan's bytes has {} pieces, but the plan recorded "
      "{} at build time",
      cut, pieces);
  try {
    CompiledModel::load_plan(ctx_, tmp("cut-tokenizer.plan"));
    ADD_FAILURE() << "a plan with a cut tokenizer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rebuild the plan"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_model_tokenizer(model, tmp("cut-tokenizer.plan")), Error);
  // A count that is missing is a corrupt header, not a plan to guess about.
  p = split_plan(slurp(tmp("t5-tiny.plan")));
  p.header["tokenizer"].erase("pieces");
  spit(tmp("no-pieces.plan"), join_plan(p));
  expect_plan_error(tmp("no-pieces.plan"), "corrupt plan header");
}

// Random single-byte corruptions of the header of a re-signed plan (a crafted file, or a writer
// bug): every outcome is a kiln::Error naming the problem, or a plan that loads and runs — never
// a crash and never a raw library exception (this runs under AddressSanitizer in `make test`).
TEST_F(PlanTest, BadInputRandomHeaderCorruptionBehindTheChecksum) {
  const PlanParts good = split_plan(slurp(tmp("bloom-tiny.plan")));
  const std::string text = good.header.dump();
  std::mt19937 rng(99);
  int refused = 0;
  for (int trial = 0; trial < 60; ++trial) {
    std::string h = text;
    h[rng() % h.size()] = "0123456789:,\"{}[]ax-"[rng() % 20];
    PlanParts p = good;
    try {
      p.header = nlohmann::json::parse(h);
    } catch (const nlohmann::json::exception&) {
      continue;  // not JSON: the reader's own parse error is tested elsewhere
    }
    spit(tmp("fuzz.plan"), join_plan(p));
    try {
      auto engine = CompiledModel::load_plan(ctx_, tmp("fuzz.plan"));
      Scheduler gen(*engine);
      GenerationParams params;
      params.max_new_tokens = 3;
      gen.generate({{291, 403, 89}}, params);
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "trial " << trial << ": raw exception " << e.what();
    }
  }
  EXPECT_GT(refused, 0);
}

TEST_F(PlanTest, VerifyFindsAFlippedWeightByte) {
  EXPECT_TRUE(verify_plan_weights(tmp("t5-tiny.plan")).empty()) << "a fresh plan verifies";
  std::string bytes = slurp(tmp("t5-tiny.plan"));
  const PlanParts p = split_plan(bytes);
  const size_t blob3 = p.header["blobs"][3]["offset"].get<size_t>();
  const size_t pos = bytes.size() - p.data.size() + blob3 + 17;
  bytes[pos] = static_cast<char>(bytes[pos] ^ 0x40);
  spit(tmp("flipped.plan"), bytes);
  EXPECT_NO_THROW(read_plan(tmp("flipped.plan"), Logger(LogLevel::kSilent)))
      << "weights are not hashed at load (that would defeat mmap)";
  const std::vector<std::string> bad = verify_plan_weights(tmp("flipped.plan"));
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_NE(bad[0].find("blob 3"), std::string::npos) << bad[0];
}

// Zero or negative sizes are refused when the plan is read, instead of loading and dying later
// with a floating-point exception inside a kernel.
TEST_F(PlanTest, BadInputZeroOrNegativeDimensions) {
  PlanParts p = split_plan(slurp(tmp("bloom-tiny.plan")));
  p.header["model"]["head_dim"] = 0;
  spit(tmp("dim0.plan"), join_plan(p));
  expect_plan_error(tmp("dim0.plan"), "positive");
  p = split_plan(slurp(tmp("bloom-tiny.plan")));
  for (auto& v : p.header["graphs"][0]["values"])
    if (v["kind"] == "activation" && v["shape"].size() == 2 && v["shape"][1].is_number()) {
      v["shape"][1] = 0;
      break;
    }
  spit(tmp("act0.plan"), join_plan(p));
  expect_plan_error(tmp("act0.plan"), "must be positive");
  p = split_plan(slurp(tmp("bloom-tiny.plan")));
  p.header["blobs"][0]["shape"][0] = -4;
  spit(tmp("neg.plan"), join_plan(p));
  expect_plan_error(tmp("neg.plan"), "must be positive");
  p = split_plan(slurp(tmp("bloom-tiny.plan")));
  p.header["profile"]["max_step_tokens"] = 0;
  spit(tmp("profile0.plan"), join_plan(p));
  expect_plan_error(tmp("profile0.plan"), "positive");
}

// Blobs are deduplicated by content: two weights with the same bytes are stored once, whatever
// tensors they came from; different bytes are never merged.
TEST_F(PlanTest, BlobsAreDeduplicatedByContent) {
  Logger quiet(LogLevel::kError);
  ModelIR model = build_model(fixture("bloom-tiny"), BuildOptions{}, quiet);
  const size_t before = split_plan(slurp(tmp("bloom-tiny.plan"))).header["blobs"].size();
  Graph& g = model.graph(kDecoderGraph);
  std::vector<Value*> norms;
  for (Value& v : g.values)
    if (v.kind == ValueKind::kWeight && v.name.find("input_layernorm.weight") != std::string::npos)
      norms.push_back(&v);
  ASSERT_GE(norms.size(), 4u);
  // Four separate tensors with equal bytes: one blob. A fifth differs in one element.
  const Tensor ones = Tensor::from_vector(std::vector<float>(256, 1.0f), {256});
  for (int i = 0; i < 4; ++i) norms[i]->data = ones.clone();
  ASSERT_NE(norms[0]->data.raw(), norms[1]->data.raw());
  if (norms.size() > 4) {
    norms[4]->data = ones.clone();
    norms[4]->data.data<float>()[100] = 1.0f + 1e-6f;
  }
  write_plan(tmp("dedup.plan"), model, PlanBuildInfo{fixture("bloom-tiny"), {}}, quiet);
  const nlohmann::json blobs = split_plan(slurp(tmp("dedup.plan"))).header["blobs"];
  EXPECT_EQ(blobs.size(), before - 3);
  std::set<std::string> hashes;
  for (const auto& b : blobs) hashes.insert(b["hash"].get<std::string>());
  EXPECT_EQ(hashes.size(), blobs.size()) << "no two blobs hold the same bytes";
  auto plan_model = read_plan(tmp("dedup.plan"), quiet);
  for (const Value& v : plan_model.graph(kDecoderGraph).values) {
    if (v.name == norms[4]->name) {
      EXPECT_EQ(v.data.data<float>()[100], 1.0f + 1e-6f);
    }
  }
}

}  // namespace
}  // namespace kiln::test
