// A lifted export is the model its HF checkpoint would be: the config and weights lifting reads
// from an export, written out as an HF checkpoint directory and built with `--model`'s path,
// give the same optimized graphs (node for node, attributes, weight bytes and layouts) and the
// same weights digest as the build from the ONNX files — so a plan from ONNX gets every fusion,
// precision and kernel, and runs as fast as one from the checkpoint.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "onnx.pb.h"

#include "builder/calibration_runner.h"
#include "builder/sensitivity.h"
#include "frontend/onnx/onnx_frontend.h"
#include "io/weight_spill.h"
#include "onnx_lift_util.h"
#include "onnx_test_models.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

using namespace lift_test;  // NOLINT: the helpers of this test family
namespace fs = std::filesystem;

// The lifted config and weights as an HF checkpoint directory with `tokenizer`.
std::string write_checkpoint(const LiftedModel& m, const std::string& tokenizer,
                             const std::string& dir) {
  std::ofstream(dir + "/config.json") << model_config_to_json(m.config);
  write_safetensors(dir + "/model.safetensors", m.tensors);
  fs::copy_file(tokenizer, fs::path(dir) / fs::path(tokenizer).filename());
  return dir;
}

void expect_same_model(const ModelIR& a, const ModelIR& b) {
  EXPECT_EQ(a.weights_digest, b.weights_digest);
  EXPECT_EQ(a.tokenizer_bytes, b.tokenizer_bytes);
  ASSERT_EQ(a.graphs.size(), b.graphs.size());
  for (size_t gi = 0; gi < a.graphs.size(); ++gi) {
    const Graph& x = a.graphs[gi];
    const Graph& y = b.graphs[gi];
    EXPECT_EQ(x.name, y.name);
    ASSERT_EQ(x.nodes.size(), y.nodes.size()) << x.name;
    for (size_t n = 0; n < x.nodes.size(); ++n) {
      EXPECT_EQ(x.nodes[n].op, y.nodes[n].op) << x.nodes[n].name;
      EXPECT_EQ(x.nodes[n].name, y.nodes[n].name);
      EXPECT_EQ(x.nodes[n].inputs, y.nodes[n].inputs) << x.nodes[n].name;
      EXPECT_TRUE(x.nodes[n].attrs == y.nodes[n].attrs) << x.nodes[n].name;
    }
    ASSERT_EQ(x.values.size(), y.values.size()) << x.name;
    int weights = 0;
    for (size_t v = 0; v < x.values.size(); ++v) {
      const Value& p = x.values[v];
      const Value& q = y.values[v];
      EXPECT_EQ(p.name, q.name);
      EXPECT_EQ(p.dtype, q.dtype) << p.name;
      EXPECT_TRUE(p.layout == q.layout) << p.name;
      if (!p.data.defined()) continue;
      ++weights;
      ASSERT_EQ(p.data.nbytes(), q.data.nbytes()) << p.name;
      EXPECT_EQ(std::memcmp(p.data.raw(), q.data.raw(), p.data.nbytes()), 0) << p.name;
    }
    EXPECT_GT(weights, 0) << x.name;
  }
}

TEST(OnnxLiftSamePlan, BloomExportIsItsCheckpoint) {
  const Logger quiet(LogLevel::kSilent);
  const std::string onnx = kOnnxDir + "/bloom.onnx";
  const LiftedFile f = lift_onnx_file(onnx, quiet);
  const LiftedModel m = assemble_bloom(*f.pattern, f.lifted, quiet);
  const std::string dir = write_checkpoint(m, kBloomTokenizer, onnx_test::test_dir());
  BuildOptions options;
  options.pack_for_cpu = CpuIsa::kAvx512;  // the packed layouts too
  expect_same_model(build_model_from_onnx({onnx}, kBloomTokenizer, options, quiet),
                    build_model(dir, options, quiet));
}

TEST(OnnxLiftSamePlan, T5ExportIsItsCheckpoint) {
  const Logger quiet(LogLevel::kSilent);
  const std::string enc = kOnnxDir + "/t5_encoder.onnx", dec = kOnnxDir + "/t5_decoder.onnx";
  const LiftedFile e = lift_onnx_file(enc, quiet), d = lift_onnx_file(dec, quiet);
  const LiftedModel m = assemble_t5(*e.pattern, e.lifted, *d.pattern, d.lifted, quiet);
  const std::string dir = write_checkpoint(m, kT5Tokenizer, onnx_test::test_dir());
  BuildOptions options;
  options.pack_for_cpu = CpuIsa::kAvx512;
  expect_same_model(build_model_from_onnx({enc, dec}, kT5Tokenizer, options, quiet),
                    build_model(dir, options, quiet));
}

// `onnx` with every initializer's bytes moved into one external data file beside it, as
// torch.onnx.export writes models over 2 GB: `align` 4096 puts each tensor at a page boundary
// (onnx's save_as_external_data for large tensors), 1 packs them at any byte offset.
// Written into `dir`.
std::string with_external_data(const std::string& onnx, int64_t align, const std::string& dir) {
  ::onnx::ModelProto m;
  {
    std::ifstream in(onnx, std::ios::binary);
    EXPECT_TRUE(m.ParseFromIstream(&in)) << onnx;
  }
  const std::string data_name = fs::path(onnx).filename().string() + ".data";
  std::string data;
  int moved = 0;
  for (::onnx::TensorProto& t : *m.mutable_graph()->mutable_initializer()) {
    if (!t.has_raw_data() || t.raw_data().empty()) continue;
    const std::string bytes = t.raw_data();
    // 1 byte of padding before each tensor when packing, so that offsets are really unaligned.
    data.resize(align > 1 ? (data.size() + align - 1) / align * align : data.size() + 1, '\0');
    onnx_test::make_external(&t, data_name, static_cast<int64_t>(data.size()),
                             static_cast<int64_t>(bytes.size()));
    data += bytes;
    ++moved;
  }
  EXPECT_GT(moved, 4) << onnx;
  onnx_test::write_bytes(dir + "/" + data_name, data);
  return onnx_test::write_model(m, dir + "/" + fs::path(onnx).filename().string());
}

// Weights in an external data file (page-aligned or packed at odd offsets) build the plan that
// the same export with inline weights builds.
TEST(OnnxLiftSamePlan, ExternalDataBuildsTheSamePlan) {
  const Logger quiet(LogLevel::kSilent);
  BuildOptions options;
  options.pack_for_cpu = CpuIsa::kAvx512;
  const std::string bloom = kOnnxDir + "/bloom.onnx";
  const std::string enc = kOnnxDir + "/t5_encoder.onnx", dec = kOnnxDir + "/t5_decoder.onnx";
  const ModelIR bloom_inline = build_model_from_onnx({bloom}, kBloomTokenizer, options, quiet);
  const ModelIR t5_inline = build_model_from_onnx({enc, dec}, kT5Tokenizer, options, quiet);
  const std::string root = onnx_test::test_dir();
  for (int64_t align : {int64_t{4096}, int64_t{1}}) {
    SCOPED_TRACE("alignment " + std::to_string(align));
    const std::string dir = root + "/align" + std::to_string(align);
    fs::create_directories(dir);
    expect_same_model(build_model_from_onnx({with_external_data(bloom, align, dir)},
                                            kBloomTokenizer, options, quiet),
                      bloom_inline);
    expect_same_model(build_model_from_onnx({with_external_data(enc, align, dir),
                                             with_external_data(dec, align, dir)},
                                            kT5Tokenizer, options, quiet),
                      t5_inline);
  }
}

// Under a build's weight spill, each Linear's transposed weight (MatMul's [in, out] to [out, in])
// is written to the spill file as it is made: the same values, none of them kept in memory.
TEST(OnnxLiftSamePlan, TransposedWeightsGoToTheBuildsSpill) {
  const Logger quiet(LogLevel::kSilent);
  const std::string onnx = kOnnxDir + "/bloom.onnx";
  const LiftedFile plain = lift_onnx_file(onnx, quiet);
  const std::shared_ptr<WeightSpill> spill = WeightSpill::create(onnx_test::test_dir(), 1);
  std::optional<LiftedFile> spilled;
  {
    WeightSpill::Scope scope(spill);
    spilled.emplace(lift_onnx_file(onnx, quiet));
  }
  ASSERT_EQ(plain.lifted.ops.size(), spilled->lifted.ops.size());
  int64_t linear_bytes = 0;
  for (size_t i = 0; i < plain.lifted.ops.size(); ++i) {
    const LiftedOp& a = plain.lifted.ops[i];
    const LiftedOp& b = spilled->lifted.ops[i];
    if (a.kind != LiftedKind::kLinear) continue;
    linear_bytes += static_cast<int64_t>(a.weight.nbytes());
    ASSERT_EQ(a.weight.shape(), b.weight.shape()) << a.anchor;
    EXPECT_EQ(std::memcmp(a.weight.raw(), b.weight.raw(), a.weight.nbytes()), 0) << a.anchor;
  }
  EXPECT_GT(linear_bytes, 0);
  EXPECT_EQ(spill->bytes_written(), linear_bytes);
}

// Calibration prompts the random fixture exports can run: texts whose tokens all lie inside
// the export's vocabulary (the fixture tokenizers know more pieces than its 96).
std::vector<CalibrationPrompt> in_vocab_prompts(const Tokenizer& tok, int64_t vocab) {
  std::vector<CalibrationPrompt> out;
  for (int64_t k = 0; k < 64 && out.size() < 12; ++k) {
    std::vector<int64_t> ids;
    for (int64_t j = 0; j < 6; ++j) ids.push_back(4 + (k * 7 + j * 13) % (vocab - 4));
    const std::string text = tok.decode(ids, true);
    const std::vector<int64_t> again = tok.encode(text);
    if (text.empty() || again.empty() ||
        std::any_of(again.begin(), again.end(), [&](int64_t id) { return id >= vocab; }))
      continue;
    out.push_back({text, "prompt " + std::to_string(k)});
  }
  EXPECT_GE(out.size(), 4u);
  return out;
}

// An int8 (W8A8) build from ONNX: calibration runs the lifted fp32 model and the sensitivity
// fallback measures lifted int8 plans, giving the cache (scales, fingerprint, kept layers) and
// the plan that the same weights' checkpoint gives.
TEST(OnnxLiftSamePlan, CalibratedInt8IsTheCheckpoints) {
  Context ctx(ContextOptions{LogLevel::kSilent, 2});
  const Logger& quiet = ctx.log();
  const std::string enc = kOnnxDir + "/t5_encoder.onnx", dec = kOnnxDir + "/t5_decoder.onnx";
  const LiftedFile e = lift_onnx_file(enc, quiet), d = lift_onnx_file(dec, quiet);
  const std::string dir =
      write_checkpoint(assemble_t5(*e.pattern, e.lifted, *d.pattern, d.lifted, quiet), kT5Tokenizer,
                       onnx_test::test_dir());
  const std::vector<CalibrationPrompt> prompts = in_vocab_prompts(*load_tokenizer_dir(dir), 96);
  BuildOptions options;
  options.precision = Precision::kInt8;
  options.pack_for_cpu = CpuIsa::kAvx512;
  CalibrationRunOptions run;
  run.new_tokens = 4;
  SensitivityOptions sensitivity;
  sensitivity.prompts = 8;
  sensitivity.new_tokens = 4;
  sensitivity.tolerance = 0.0;  // keep float every layer whose error is measurable
  const CalibrationMethodSpec method = parse_calibration_method("minmax");
  auto calibrate = [&](const ModelSource& source) {
    BuildOptions measured = options;
    measured.precision_options.calibration =
        calibrate_checkpoint(ctx, source, options, prompts, run, method);
    measured.precision_options.calibration =
        apply_sensitivity_fallback(ctx, source, measured, prompts, sensitivity);
    return measured;
  };
  const BuildOptions from_onnx = calibrate(ModelSource::onnx({enc, dec}, kT5Tokenizer));
  const BuildOptions from_dir = calibrate(ModelSource(dir));
  const CalibrationCache& a = *from_onnx.precision_options.calibration;
  const CalibrationCache& b = *from_dir.precision_options.calibration;
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_FALSE(a.scales.empty());
  ASSERT_EQ(a.fallback.size(), b.fallback.size());
  for (auto ia = a.fallback.begin(), ib = b.fallback.begin(); ia != a.fallback.end(); ++ia, ++ib)
    EXPECT_EQ(ia->first, ib->first);
  expect_same_model(build_model(ModelSource::onnx({enc, dec}, kT5Tokenizer), from_onnx, quiet),
                    build_model(dir, from_dir, quiet));
}

}  // namespace
}  // namespace kiln
