#include <map>
#include <nlohmann/json.hpp>

#include "backend/executor.h"
#include "commands.h"
#include "graph/workspace.h"
#include "plan/plan.h"

namespace kiln::cli {

Runner add_inspect(CLI::App& app) {
  struct Opts {
    std::string plan, model, onnx;
    bool graph = false, verify = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "Show what a plan (or an HF directory, built in memory) contains: build metadata, layers,\n"
      "fusions, dtypes, weight and activation memory.\n"
      "Examples:\n"
      "  kiln inspect t5.plan\n"
      "  kiln inspect --model models/bloom-tiny --graph");
  cmd->add_option("plan", o->plan, "plan file");
  cmd->add_option("--model", o->model, "HF directory");
  cmd->add_option("--onnx", o->onnx, "ONNX file (not built yet)");
  cmd->add_flag("--graph", o->graph, "print every node (the IR dump)");
  cmd->add_flag("--verify", o->verify,
                "also hash every weight blob and compare with the hashes recorded at build time "
                "(the header and tokenizer are checked on every load)");
  return [o](const GlobalOptions& g) {
    KILN_CHECK_USAGE(o->onnx.empty(), "--onnx: the ONNX frontend is not built yet");
    KILN_CHECK_USAGE(o->plan.empty() != o->model.empty(), "give a plan file or --model");
    KILN_CHECK_USAGE(!o->verify || !o->plan.empty(), "--verify checks a plan file");
    auto ctx = make_context(g);
    ModelIR model;
    if (!o->plan.empty()) {
      fmt::print("plan {}\n{}\n", o->plan, read_plan_metadata_json(o->plan));
      model = read_plan(o->plan, ctx->log());
      if (o->verify) {
        const std::vector<std::string> bad = verify_plan_weights(o->plan);
        for (const std::string& line : bad) fmt::print(stderr, "kiln inspect: {}\n", line);
        KILN_CHECK(bad.empty(),
                   "{}: {} weight blob(s) do not match their recorded hashes; the "
                   "file is damaged: rebuild it",
                   o->plan, bad.size());
        fmt::print("verify: every weight blob matches its recorded hash\n");
      }
    } else {
      model = build_model(o->model, BuildOptions{}, ctx->log());
    }
    fmt::print("architecture: {}  prompt template: \"{}\"  max input tokens: {}\n",
               model.desc.architecture, model.prompt_template, model.profile.max_input_tokens);
    for (const Graph& gr : model.graphs) {
      std::map<std::string, int> ops;
      std::map<std::string, int64_t> dtypes;
      int fused_linear = 0;
      for (const Node& n : gr.nodes) {
        ++ops[std::string(op_name(n.op))];
        if (n.op == OpKind::kLinear && n.attr<LinearAttrs>().activation) ++fused_linear;
      }
      for (const Value& v : gr.values)
        if (v.kind == ValueKind::kWeight)
          dtypes[std::string(dtype_name(v.dtype))] += v.data.nbytes();
      fmt::print("\ngraph '{}': {} nodes, {} values\n", gr.name, gr.nodes.size(), gr.values.size());
      fmt::print("  layers:");
      for (const auto& [op, count] : ops) fmt::print(" {}×{}", op, count);
      fmt::print("\n  fusions: {} Linear+activation, {} AddRMSNorm\n", fused_linear,
                 ops.count("AddRMSNorm") ? ops["AddRMSNorm"] : 0);
      fmt::print("  weights:");
      for (const auto& [dt, bytes] : dtypes)
        fmt::print(" {} {:.2f} MiB", dt, static_cast<double>(bytes) / (1 << 20));
      fmt::print("\n  workspace per token bucket ({} slots):", gr.num_slots);
      for (int64_t bucket : model.profile.token_buckets) {
        const WorkspaceLayout r =
            workspace_layout(gr, GraphExecutor::bucket_bindings(model.profile, bucket));
        fmt::print(" {}: {:.1f} KiB (unplanned {:.1f} KiB);", bucket,
                   static_cast<double>(r.bytes) / 1024,
                   static_cast<double>(r.unplanned_bytes) / 1024);
      }
      fmt::print("\n");
      if (o->graph) fmt::print("{}", dump_graph(gr));
    }
    return 0;
  };
}

}  // namespace kiln::cli
