#include <map>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "devices.h"
#include "graph/workspace.h"
#include "output.h"
#include "plan/plan.h"

namespace kiln::cli {
namespace {

// "rows=16 tokens=16", in the order the build log's plan_memory line prints them.
std::string bindings_str(const std::map<std::string, int64_t>& bindings) {
  std::string s;
  for (const auto& [k, v] : bindings) s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, v);
  return s;
}

// The precision plan of every layer that has a weight matrix (Linear, Embedding): the type its
// weight is stored in, the type it computes in and, when wider than the plan's precision, why;
// and the nodes and weights kept wider grouped by why (the precision pass's notes).
nlohmann::json precision_summary(const Graph& gr, const std::vector<PrecisionNote>& notes) {
  std::map<std::string, std::string> why_node, why_weight;
  for (const PrecisionNote& note : notes)
    if (note.graph == gr.name)
      (note.node.empty() ? why_weight[note.weight] : why_node[note.node]) = note.reason;
  nlohmann::json layers = nlohmann::json::array();
  for (const Node& n : gr.nodes) {
    if (n.op != OpKind::kLinear && n.op != OpKind::kEmbedding) continue;
    const Value& w = gr.values[n.inputs[n.op == OpKind::kLinear ? 1 : 0]];
    // A Linear computes in its input's type (a widened output is rounded there first); an
    // Embedding gathers rows of its table's.
    std::string compute(dtype_name(n.op == OpKind::kLinear ? gr.values[n.inputs[0]].dtype
                                                           : gr.values[n.outputs[0]].dtype));
    // A W8A8 (fp8) Linear reads its input as int8 (E4M3), with the calibrated scale it holds.
    const int input_scale =
        n.op == OpKind::kLinear ? linear_operand(n, LinearOperand::kInputScale) : -1;
    if (input_scale >= 0) compute = w.dtype == DType::kF8E4M3 ? "f8_e4m3" : "i8";
    std::string why = why_node.count(n.name) ? why_node[n.name] : "";
    if (why.empty() && why_weight.count(w.name)) why = why_weight[w.name];
    std::string dtype(dtype_name(w.dtype));
    if (w.dtype == DType::kI8 || w.dtype == DType::kF8E4M3)
      dtype += n.op == OpKind::kLinear ? " (per-channel f32 scales)" : " (per-row f32 scales)";
    if (w.dtype == DType::kI4) dtype += " (f16 scales per group of 128)";
    const std::string layout =
        w.layout.plain() ? "plain" : w.layout.packing + " for " + w.layout.target;
    layers.push_back({{"layer", n.name},
                      {"op", op_name(n.op)},
                      {"weight", w.name},
                      {"dtype", dtype},
                      {"compute", compute},
                      {"layout", layout},
                      {"why", why}});
    if (input_scale >= 0)
      layers.back()["input_scale"] =
          gr.values[static_cast<size_t>(input_scale)].data.to_f32().data<float>()[0];
  }
  // (reason, "weights" | "nodes") -> names
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> by_reason;
  for (const PrecisionNote& note : notes)
    if (note.graph == gr.name) {
      const bool node = !note.node.empty();
      by_reason[{note.reason, node ? "nodes" : "weights"}].push_back(node ? note.node
                                                                          : note.weight);
    }
  nlohmann::json kept = nlohmann::json::array();
  for (const auto& [key, names] : by_reason)
    kept.push_back({{"reason", key.first}, {"count", names.size()}, {key.second, names}});
  return {{"layers", layers}, {"kept_wider", kept}};
}

nlohmann::json graph_summary(const Graph& gr, const ShapeProfile& profile) {
  std::map<std::string, int> ops;
  std::map<std::string, int64_t> weight_bytes;
  int fused_linear = 0;
  for (const Node& n : gr.nodes) {
    ++ops[std::string(op_name(n.op))];
    if (n.op == OpKind::kLinear && n.attr<LinearAttrs>().epilogue.activation) ++fused_linear;
  }
  for (const Value& v : gr.values)
    if (v.kind == ValueKind::kWeight)
      weight_bytes[std::string(dtype_name(v.dtype))] += v.data.nbytes();
  int streamed = 0;
  for (size_t o = 0; o < gr.outputs.size(); ++o) streamed += gr.streams_output(o);
  nlohmann::json workspace = nlohmann::json::array();
  for (int64_t bucket : profile.token_buckets) {
    const auto bindings = profile.bucket_bindings(bucket);
    const WorkspaceLayout r = workspace_layout(gr, bindings);
    workspace.push_back(
        {{"bindings", bindings}, {"bytes", r.bytes}, {"unplanned_bytes", r.unplanned_bytes}});
  }
  return {{"name", gr.name},
          {"nodes", gr.nodes.size()},
          {"values", gr.values.size()},
          {"layers", ops},
          {"fusions",
           {{"linear_activation", fused_linear},
            {"add_rms_norm", ops.count("AddRMSNorm") ? ops["AddRMSNorm"] : 0}}},
          {"weight_bytes", weight_bytes},
          {"slots", gr.num_slots},
          {"streamed_outputs", streamed},
          {"workspace", workspace}};
}

void print_precision(const nlohmann::json& p, bool every_layer) {
  std::map<std::string, int> counts;  // "Linear bf16" -> layers
  for (const auto& l : p["layers"])
    ++counts[l["op"].get<std::string>() + " " + l["dtype"].get<std::string>() +
             (l.contains("input_scale") ? " × " + l["compute"].get<std::string>() + " input" : "")];
  std::string line;
  for (const auto& [what, count] : counts)
    line += fmt::format("{}{}×{}", line.empty() ? "" : ", ", what, count);
  out("  layer precision: {}\n", line.empty() ? "no weight matrices" : line);
  std::map<std::string, int> layouts;  // "Linear panel16 for avx512" -> layers
  for (const auto& l : p["layers"])
    ++layouts[l["op"].get<std::string>() + " " + l["layout"].get<std::string>()];
  line.clear();
  for (const auto& [what, count] : layouts)
    line += fmt::format("{}{}×{}", line.empty() ? "" : ", ", what, count);
  if (!line.empty()) out("  weight layout: {}\n", line);
  if (every_layer) {
    out("    {:<48} {:<9} {:<27} {:<7} {:<24} {}\n", "layer", "op", "weight", "compute", "layout",
        "why wider");
    for (const auto& l : p["layers"])
      out("    {:<48} {:<9} {:<27} {:<7} {:<24} {}\n", l["layer"].get<std::string>(),
          l["op"].get<std::string>(), l["dtype"].get<std::string>(),
          l["compute"].get<std::string>(), l["layout"].get<std::string>(),
          l["why"].get<std::string>());
  }
  for (const auto& k : p["kept_wider"]) {
    const char* kind = k.contains("nodes") ? "node" : "weight";
    out("  kept f32 ({} {}{}, e.g. {}): {}\n", k["count"].get<int>(), kind,
        k["count"].get<int>() == 1 ? "" : "s", k[std::string(kind) + "s"][0].get<std::string>(),
        k["reason"].get<std::string>());
  }
}

void print_graph_summary(const nlohmann::json& s, bool every_layer) {
  out("\ngraph '{}': {} nodes, {} values\n", s["name"].get<std::string>(),
      s["nodes"].get<int64_t>(), s["values"].get<int64_t>());
  std::string layers;
  for (const auto& [op, count] : s["layers"].items())
    layers += fmt::format(" {}×{}", op, count.get<int>());
  out("  layers:{}\n", layers);
  out("  fusions: {} Linear+activation, {} AddRMSNorm\n",
      s["fusions"]["linear_activation"].get<int>(), s["fusions"]["add_rms_norm"].get<int>());
  std::string weights;
  for (const auto& [dt, bytes] : s["weight_bytes"].items())
    weights += fmt::format(" {} {:.2f} MiB", dt, bytes.get<double>() / (1 << 20));
  out("  weights:{}\n", weights);
  print_precision(s["precision"], every_layer);
  const int streamed = s["streamed_outputs"].get<int>();
  out("  workspace per token bucket ({} slots{}):\n", s["slots"].get<int>(),
      streamed == 0
          ? ""
          : fmt::format("; {} outputs streamed: handed to the runtime as written", streamed));
  for (const auto& w : s["workspace"])
    out("    {}: {:.1f} KiB (unplanned {:.1f} KiB)\n",
        bindings_str(w["bindings"].get<std::map<std::string, int64_t>>()),
        w["bytes"].get<double>() / 1024, w["unplanned_bytes"].get<double>() / 1024);
}

}  // namespace

Runner add_inspect(CLI::App& app) {
  struct Opts {
    std::string plan, plan_flag, model, onnx;
    bool graph = false, verify = false, json = false, layers = false, device = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "Show what a plan (or an HF directory, built in memory, or an ONNX file) contains");
  describe(cmd,
           "Build metadata, layers, fusions, dtypes, weight memory and the activation workspace\n"
           "per token bucket (the same numbers the build log reports).\n"
           "With --onnx: the file's IR version, opset and producer, its inputs and outputs with\n"
           "their dtypes and shapes (symbolic dimensions by name), an op histogram, the\n"
           "initializers' count and bytes, and every node whose op kiln does not import.\n"
           "Examples:\n"
           "  kiln inspect t5.plan\n"
           "  kiln inspect --plan bloom.plan --json\n"
           "  kiln inspect --model models/bloom-tiny --graph\n"
           "  kiln inspect --onnx model.onnx --json\n"
           "  kiln inspect --device");
  cmd->add_option("plan", o->plan, "plan file (or --plan PLAN)");
  cmd->add_option("--plan", o->plan_flag, "plan file");
  cmd->add_option("--model", o->model, "HF directory");
  cmd->add_option("--onnx", o->onnx,
                  "ONNX file: what the ONNX frontend reads from it (--json: {\"opset\", "
                  "\"producer\", \"inputs\", \"outputs\", \"ops\", \"initializers\", "
                  "\"unsupported_ops\", ...})");
  cmd->add_flag("--graph", o->graph, "print every node (the IR dump)");
  cmd->add_flag("--layers", o->layers,
                "list the precision of every Linear and Embedding layer (the summary counts them)");
  cmd->add_flag("--json", o->json,
                "print one JSON object: {\"source\", \"metadata\", \"graphs\": [{\"name\", "
                "\"layers\", \"fusions\", \"weight_bytes\", \"precision\", \"workspace\", ...}]} "
                "(with --graph: "
                "each graph's \"dump\")");
  cmd->add_flag("--device", o->device,
                "show this machine's devices and the options each backend runs with (the "
                "KILN_* switches, read from the environment); alone, or before a plan's report");
  cmd->add_flag("--verify", o->verify,
                "also hash every weight blob and compare with the hashes recorded at build time "
                "(the header and tokenizer are checked on every load)");
  return [o](const GlobalOptions& g) {
    if (!o->onnx.empty()) {
      KILN_CHECK_USAGE(o->plan.empty() && o->plan_flag.empty() && o->model.empty(),
                       "give one of PLAN, --plan, --model and --onnx");
      KILN_CHECK_USAGE(!o->graph && !o->layers && !o->verify && !o->device,
                       "--onnx takes --json only (--graph, --layers, --verify and --device are "
                       "for plans)");
      return inspect_onnx(o->onnx, o->json);
    }
    KILN_CHECK_USAGE(o->plan.empty() || o->plan_flag.empty(),
                     "give the plan once: as an argument or with --plan");
    const std::string plan = o->plan.empty() ? o->plan_flag : o->plan;
    KILN_CHECK_USAGE(plan.empty() != o->model.empty() || (o->device && plan.empty()),
                     "give a plan (PLAN or --plan PLAN) or --model DIR");
    KILN_CHECK_USAGE(!o->verify || !plan.empty(), "--verify checks a plan file, not --model");
    auto ctx = make_context(g);
    nlohmann::json report;
    if (o->device) {
      const std::vector<DeviceEntry> devices = device_report(*ctx);
      if (plan.empty() && o->model.empty()) {
        if (o->json)
          out_line(nlohmann::json({{"devices", device_report_json(devices)}}).dump());
        else
          out_text(device_report_text(devices));
        return 0;
      }
      if (o->json)
        report["devices"] = device_report_json(devices);
      else
        out_text(device_report_text(devices));
    }
    ModelIR model;
    if (!plan.empty()) {
      check_plan_file(plan, o->plan.empty() ? "--plan" : "PLAN");
      report["source"] = {{"plan", plan}};
      report["metadata"] = nlohmann::json::parse(read_plan_metadata_json(plan));
      model = read_plan(plan, ctx->log());
      if (o->verify) {
        Activity activity(ctx->log(), "hashing the weights of " + plan);
        const std::vector<std::string> bad = verify_plan_weights(plan);
        for (const std::string& line : bad) ctx->log().write(LogLevel::kError, line);
        KILN_CHECK(bad.empty(),
                   "{}: {} weight blob(s) do not match their recorded hashes; the "
                   "file is damaged: rebuild it",
                   plan, bad.size());
        report["verify"] = "every weight blob matches its recorded hash";
      }
    } else {
      check_model_dir(o->model, "--model");
      report["source"] = {{"model", o->model}};
      Activity activity(ctx->log(), "building " + o->model + " in memory");
      model = build_model(o->model, BuildOptions{}, ctx->log());
    }
    report["architecture"] = model.desc.architecture;
    report["precision"] = precision_name(model.precision);
    report["kv_cache"] = kv_cache_name(model.kv_cache);
    report["prompt_template"] = model.prompt_template;
    report["max_input_tokens"] = model.profile.max_input_tokens;
    report["graphs"] = nlohmann::json::array();
    for (const Graph& gr : model.graphs) {
      report["graphs"].push_back(graph_summary(gr, model.profile));
      report["graphs"].back()["precision"] = precision_summary(gr, model.precision_notes);
      if (o->graph && o->json) report["graphs"].back()["dump"] = dump_graph(gr);
    }
    if (o->json) {
      out_line(report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return 0;
    }
    if (report.contains("metadata"))
      out("plan {}\n{}\n", plan,
          report["metadata"].dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    if (report.contains("verify")) out("verify: {}\n", report["verify"].get<std::string>());
    out("architecture: {}  prompt template: \"{}\"  max input tokens: {}  precision: {}{}\n",
        model.desc.architecture, model.prompt_template, model.profile.max_input_tokens,
        precision_name(model.precision),
        model.kv_cache == KvCache::kAuto
            ? ""
            : fmt::format("  kv cache: {} (E4M3 keys and values)", kv_cache_name(model.kv_cache)));
    for (size_t i = 0; i < model.graphs.size(); ++i) {
      print_graph_summary(report["graphs"][i], o->layers);
      if (o->graph) out_text(dump_graph(model.graphs[i]));
    }
    return 0;
  };
}

}  // namespace kiln::cli
