// kiln exec: one forward pass of an ONNX graph through the import graph's reference interpreter
// (polygraphy's `run` for kiln): named inputs from a safetensors file, every graph output written
// by name, optionally compared with reference outputs (onnxruntime's).
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "exec_compare.h"
#include "exec_plan.h"
#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/run_import_graph.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "output.h"

namespace kiln::cli {
namespace {

struct ExecOptions {
  std::string onnx, plan, graph = "decoder", inputs, input_prefix, output, compare, compare_prefix,
                          compare_mask;
  double atol = 1e-5, rtol = 1e-5;
  bool json = false;
};

// The ONNX element type of a safetensors tensor fed to graph input `want`: safetensors' own
// type, except that an I8 tensor may feed a bool or uint8 input (kiln reads no BOOL or U8
// safetensors).
OnnxElemType input_elem_type(DType dtype, OnnxElemType want) {
  switch (dtype) {
    case DType::kF32:
      return OnnxElemType::kFloat;
    case DType::kF16:
      return OnnxElemType::kFloat16;
    case DType::kBF16:
      return OnnxElemType::kBFloat16;
    case DType::kI64:
      return OnnxElemType::kInt64;
    case DType::kI32:
      return OnnxElemType::kInt32;
    case DType::kI8:
      return want == OnnxElemType::kBool || want == OnnxElemType::kUint8 ? want
                                                                         : OnnxElemType::kInt8;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI4:
      break;
  }
  return OnnxElemType::kUndefined;
}

// The tensors of `file` whose names start with `prefix`, the prefix removed.
std::map<std::string, Tensor> select(const SafetensorsFile& file, const std::string& prefix) {
  std::map<std::string, Tensor> picked;
  for (const auto& [name, t] : file.tensors())
    if (name.starts_with(prefix)) picked[name.substr(prefix.size())] = t;
  return picked;
}

std::map<std::string, ImportTensor> read_inputs(const ImportGraph& graph, const ExecOptions& o) {
  const SafetensorsFile file = SafetensorsFile::open(o.inputs);
  const std::map<std::string, Tensor> tensors = select(file, o.input_prefix);
  KILN_CHECK_USAGE(
      !tensors.empty(), "--inputs {}: no tensor{}", o.inputs,
      o.input_prefix.empty() ? "" : fmt::format(" whose name starts with '{}'", o.input_prefix));
  std::map<std::string, ImportTensor> inputs;
  for (const auto& [name, t] : tensors) {
    const int v = graph.find_value(name);
    const OnnxElemType want = v >= 0 ? graph.values()[v].type : OnnxElemType::kUndefined;
    const OnnxElemType type = input_elem_type(t.dtype(), want);
    KILN_CHECK_USAGE(type != OnnxElemType::kUndefined,
                     "--inputs {}: tensor '{}{}' is {}, which "
                     "no ONNX input takes",
                     o.inputs, o.input_prefix, name, dtype_name(t.dtype()));
    inputs[name] = ImportTensor::from_tensor(type, t);
  }
  return inputs;
}

std::optional<CompareMask> mask_from(const ExecOptions& o,
                                     const std::map<std::string, ImportTensor>& inputs) {
  if (o.compare_mask.empty()) return std::nullopt;
  const auto it = inputs.find(o.compare_mask);
  KILN_CHECK_USAGE(it != inputs.end(), "--compare-mask {}: no input of that name in --inputs {}",
                   o.compare_mask, o.inputs);
  const ImportTensor& t = it->second;
  KILN_CHECK_USAGE(t.rank() == 2 && !is_float_type(t.type()),
                   "--compare-mask {}: the mask must be a [batch, sequence] integer or bool "
                   "tensor, got {}",
                   o.compare_mask, t.describe());
  return CompareMask{o.compare_mask, t.shape(), t.to_int64s()};
}

std::string shape_text(const ImportTensor& t) { return t.describe(); }

nlohmann::json comparison_json(const OutputComparison& c) {
  nlohmann::json j = {{"name", c.name}, {"pass", c.pass}};
  if (!c.problem.empty()) {
    j["problem"] = c.problem;
    return j;
  }
  j["compared"] = c.compared;
  j["masked"] = c.masked;
  j["max_abs_error"] = c.max_abs_error;
  j["max_rel_error"] = c.max_rel_error;
  j["max_abs_ref"] = c.max_abs_ref;
  j["mismatches"] = c.mismatches;
  return j;
}

// The plan path's outputs in the interpreter's tensors (for the shared writing and comparing).
std::map<std::string, ImportTensor> exec_plan(const ExecOptions& o, Context& ctx,
                                              std::map<std::string, ImportTensor>* inputs,
                                              std::vector<std::string>* order, int64_t* sequences) {
  const SafetensorsFile file = SafetensorsFile::open(o.inputs);
  const std::map<std::string, Tensor> tensors = select(file, o.input_prefix);
  KILN_CHECK_USAGE(
      !tensors.empty(), "--inputs {}: no tensor{}", o.inputs,
      o.input_prefix.empty() ? "" : fmt::format(" whose name starts with '{}'", o.input_prefix));
  std::unique_ptr<CompiledModel> engine = open_engine(ctx, o.plan, {});
  const PlanExec run = run_plan_exec(*engine, o.graph, tensors);
  for (const auto& [name, t] : tensors)
    if (t.dtype() == DType::kI64)
      (*inputs)[name] = ImportTensor::from_tensor(OnnxElemType::kInt64, t);
  std::map<std::string, ImportTensor> outputs;
  for (const auto& [name, t] : run.outputs)
    outputs[name] = ImportTensor::from_tensor(OnnxElemType::kFloat, t);
  *order = run.order;
  *sequences = run.sequences;
  return outputs;
}

int run_exec(const ExecOptions& o, const GlobalOptions& g) {
  KILN_CHECK_USAGE(o.onnx.empty() != o.plan.empty(), "give either --onnx FILE or --plan PLAN");
  KILN_CHECK_USAGE(o.graph == "decoder" || !o.plan.empty(), "--graph is for --plan");
  if (o.onnx.empty())
    check_input_file(o.plan, "--plan");
  else
    check_input_file(o.onnx, "--onnx");
  KILN_CHECK_USAGE(o.atol >= 0 && o.rtol >= 0, "--atol and --rtol must be >= 0");
  KILN_CHECK_USAGE(o.compare_prefix.empty() || !o.compare.empty(),
                   "--compare-prefix needs --compare REF.safetensors");
  KILN_CHECK_USAGE(o.compare_mask.empty() || !o.compare.empty(),
                   "--compare-mask needs --compare REF.safetensors");
  check_input_file(o.inputs, "--inputs");
  if (!o.compare.empty()) check_input_file(o.compare, "--compare");
  if (!o.output.empty()) AtomicFileWriter::check_target(o.output, "-o");
  auto ctx = make_context(g);
  std::map<std::string, ImportTensor> inputs, outputs;
  std::vector<std::string> order;  // graph outputs in the file's order
  ImportRunStats stats;
  int64_t sequences = 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (!o.plan.empty()) {
    outputs = exec_plan(o, *ctx, &inputs, &order, &sequences);
  } else {
    const OnnxModel model = read_onnx_model(o.onnx);
    const ImportGraph graph = ImportGraph::build(model);
    inputs = read_inputs(graph, o);
    mask_from(o, inputs);  // a bad --compare-mask fails before the graph runs
    outputs = run_import_graph(graph, inputs, &stats);
    for (int v : graph.outputs()) order.push_back(graph.values()[v].name);
  }
  const std::optional<CompareMask> mask = mask_from(o, inputs);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string source = o.plan.empty() ? o.onnx : o.plan;
  if (o.plan.empty())
    ctx->log().info("{}: {} nodes folded for the inputs' shapes, {} run, in {:.3f} s", o.onnx,
                    stats.folded_nodes, stats.executed_nodes, seconds);
  else
    ctx->log().info("{}: graph {}, {} sequences, in {:.3f} s", o.plan, o.graph, sequences, seconds);
  if (!o.output.empty()) {
    std::map<std::string, Tensor> tensors;
    std::vector<std::string> bools;
    for (const auto& [name, t] : outputs) {
      tensors[name] = t.to_kiln();
      if (t.type() == OnnxElemType::kBool) bools.push_back(name);
    }
    std::map<std::string, std::string> metadata = {
        {o.plan.empty() ? "kiln.exec.onnx" : "kiln.exec.plan", source}};
    if (!bools.empty())
      metadata["kiln.exec.bool_outputs_as_i8"] = fmt::format("{}", fmt::join(bools, ","));
    write_safetensors(o.output, tensors, metadata);
  }

  std::vector<OutputComparison> comparisons;
  if (!o.compare.empty()) {
    const SafetensorsFile ref_file = SafetensorsFile::open(o.compare);
    const std::map<std::string, Tensor> refs = select(ref_file, o.compare_prefix);
    for (const std::string& name : order) {
      const auto it = refs.find(name);
      comparisons.push_back(compare_output(
          name, outputs.at(name), it == refs.end() ? nullptr : &it->second, o.atol, o.rtol, mask));
    }
  }
  bool pass = true;
  for (const OutputComparison& c : comparisons) pass = pass && c.pass;

  if (o.json) {
    nlohmann::json report = {{"seconds", seconds}};
    if (o.plan.empty()) {
      report["onnx"] = o.onnx;
      report["folded_nodes"] = stats.folded_nodes;
      report["executed_nodes"] = stats.executed_nodes;
    } else {
      report["plan"] = o.plan;
      report["graph"] = o.graph;
      report["sequences"] = sequences;
    }
    report["outputs"] = nlohmann::json::array();
    for (const std::string& name : order) {
      const ImportTensor& t = outputs.at(name);
      report["outputs"].push_back(
          {{"name", name}, {"dtype", onnx_elem_type_name(t.type())}, {"shape", t.shape()}});
    }
    if (!o.output.empty()) report["written"] = o.output;
    if (!o.compare.empty()) {
      nlohmann::json list = nlohmann::json::array();
      for (const OutputComparison& c : comparisons) list.push_back(comparison_json(c));
      report["compare"] = {
          {"reference", o.compare}, {"atol", o.atol},
          {"rtol", o.rtol},         {"mask", mask ? nlohmann::json(mask->input) : nlohmann::json()},
          {"outputs", list},        {"pass", pass}};
    }
    out_line(report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return pass ? 0 : 1;
  }
  if (o.plan.empty())
    out("{}: {} nodes ({} folded for the inputs' shapes, {} run) in {:.3f} s\n", o.onnx,
        stats.folded_nodes + stats.executed_nodes, stats.folded_nodes, stats.executed_nodes,
        seconds);
  else
    out("{}: graph {}, {} sequences in {:.3f} s\n", o.plan, o.graph, sequences, seconds);
  for (const std::string& name : order)
    out("  output {:<24} {}\n", name, shape_text(outputs.at(name)));
  if (!o.output.empty())
    out("wrote {} ({} output{})\n", o.output, outputs.size(), outputs.size() == 1 ? "" : "s");
  if (o.compare.empty()) return 0;
  out("compare with {} (atol {:g}, rtol {:g}{}):\n", o.compare, o.atol, o.rtol,
      mask ? ", where " + mask->input + " is nonzero" : "");
  for (const OutputComparison& c : comparisons) {
    if (!c.problem.empty()) {
      out("  {:<24} FAIL: {}\n", c.name, c.problem);
      continue;
    }
    out("  {:<24} max abs error {:.3g}, max rel error {:.3g}, max |ref| {:.3g}, {} elements{}: "
        "{}\n",
        c.name, c.max_abs_error, c.max_rel_error, c.max_abs_ref, c.compared,
        c.masked ? " (masked)" : "",
        c.pass ? "PASS" : fmt::format("FAIL ({} outside tolerance)", c.mismatches));
  }
  int passed = 0;
  for (const OutputComparison& c : comparisons) passed += c.pass ? 1 : 0;
  out("{}: {} of {} outputs within tolerance\n", pass ? "PASS" : "FAIL", passed,
      comparisons.size());
  return pass ? 0 : 1;
}

}  // namespace

Runner add_exec(CLI::App& app) {
  auto o = std::make_shared<ExecOptions>();
  CLI::App* cmd = app.add_subcommand(
      "exec", "Run an ONNX graph (kiln's reference interpreter) or a plan once on named inputs");
  describe(
      cmd,
      "One forward pass of an ONNX file through the ONNX frontend's interpreter (CPU, exact\n"
      "ONNX semantics, not fast): the inputs are the tensors of a safetensors file named like\n"
      "the graph's inputs (checked: every input given, its dtype, rank and numeric dimensions,\n"
      "symbolic dimensions such as batch equal across inputs). Shape subgraphs are folded for\n"
      "the inputs' shapes first, then the rest runs. -o writes every graph output by name.\n"
      "--compare reads reference outputs (from onnxruntime, say) and prints, per output, the\n"
      "max absolute and relative error and PASS/FAIL with numpy's allclose rule\n"
      "|out - ref| <= atol + rtol * |ref|; the exit code is 1 when an output fails.\n"
      "Values at padded positions (attention_mask 0) may differ from onnxruntime's: the model\n"
      "leaves them undefined (whatever reads them masks them out). --compare-mask\n"
      "attention_mask leaves those positions out (for outputs whose first two dimensions are\n"
      "the mask's [batch, sequence]).\n"
      "Inputs that do not match the graph are usage errors (exit 2); a node that fails (shapes\n"
      "that do not match, an index out of range) is a runtime error (exit 1) naming the node.\n"
      "Safetensors has no BOOL or U8 in kiln's reader: give such inputs as I8; bool outputs\n"
      "are written as I8 (0/1) and listed in the file's metadata.\n"
      "--plan PLAN runs a plan instead (from `kiln build --model` or `--onnx`), each row of\n"
      "the batch one sequence of the tokens where attention_mask is nonzero, through the plan's\n"
      "graphs (fused, KV-cached kernels); padded positions of the outputs are zeros. Inputs:\n"
      "  BLOOM plans (--graph decoder): input_ids, attention_mask -> logits\n"
      "  T5 plans --graph encoder: input_ids, attention_mask -> last_hidden_state\n"
      "  T5 plans --graph decoder: input_ids, attention_mask, decoder_input_ids -> logits\n"
      "    (the encoder runs on input_ids), or the T5 decoder export's own inputs: input_ids\n"
      "    (the decoder's), encoder_hidden_states, encoder_attention_mask -> logits (the\n"
      "    encoder does not run: its cross K/V projections read the states given).\n"
      "Example (the fixture BLOOM export and onnxruntime's outputs, stored under prefixes):\n"
      "  kiln exec --onnx ../shared/fixtures/onnx/bloom.onnx --inputs "
      "../shared/fixtures/onnx/reference.safetensors --input-prefix bloom.in. -o "
      "/tmp/bloom_out.safetensors --compare ../shared/fixtures/onnx/reference.safetensors "
      "--compare-prefix bloom.out. --atol 1e-4 --rtol 1e-3 --compare-mask attention_mask");
  one_value(cmd->add_option("--onnx", o->onnx, "the ONNX file"));
  one_value(cmd->add_option("--plan", o->plan,
                            "instead of --onnx: a plan, run through its own graphs on the ONNX "
                            "exports' padded inputs (see above)"));
  one_value(cmd->add_option("--graph", o->graph,
                            "with --plan: decoder (default) or, for T5 plans, encoder"));
  one_value(cmd->add_option("--inputs", o->inputs,
                            "safetensors file with one tensor per graph input, by name")
                ->required());
  one_value(cmd->add_option("--input-prefix", o->input_prefix,
                            "take only --inputs tensors whose names start with this, the prefix "
                            "removed (\"bloom.in.\")"));
  one_value(cmd->add_option("-o,--output", o->output,
                            "safetensors file to write every graph output to, by name"));
  one_value(cmd->add_option("--compare", o->compare,
                            "safetensors file of reference outputs, by output name"));
  one_value(cmd->add_option("--compare-prefix", o->compare_prefix,
                            "reference tensors are named this + the output name "
                            "(\"bloom.out.\")"));
  one_value(cmd->add_option("--compare-mask", o->compare_mask,
                            "a [batch, sequence] input (attention_mask): compare only where it "
                            "is nonzero"));
  cmd->add_option("--atol", o->atol, "absolute tolerance (default 1e-5)")
      ->check(number_check([](double v) { return v >= 0; }, "a number >= 0"));
  cmd->add_option("--rtol", o->rtol, "relative tolerance (default 1e-5)")
      ->check(number_check([](double v) { return v >= 0; }, "a number >= 0"));
  cmd->add_flag("--json", o->json,
                "print one JSON object: {\"onnx\", \"folded_nodes\", \"executed_nodes\", "
                "\"seconds\", \"outputs\": [{\"name\", \"dtype\", \"shape\"}], \"compare\": "
                "{\"outputs\": [{\"name\", \"max_abs_error\", \"max_rel_error\", \"max_abs_ref\", "
                "\"pass\", ...}], \"pass\"}}");
  return [o](const GlobalOptions& g) { return run_exec(*o, g); };
}

}  // namespace kiln::cli
