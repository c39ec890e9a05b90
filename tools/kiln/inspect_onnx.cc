// `kiln inspect --onnx FILE`: what an ONNX file holds, as the ONNX frontend reads it (opset,
// producer, inputs and outputs with symbolic shapes, op histogram, initializers, and the ops kiln
// does not import).
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "frontend/onnx/fold_import_graph.h"
#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/lift_model.h"
#include "frontend/onnx/onnx_frontend.h"
#include "frontend/onnx/supported_ops.h"
#include "output.h"

namespace kiln::cli {
namespace {

// Numbers for static dimensions, names for symbolic ones, null for unknown ones; null for an
// unknown rank.
nlohmann::json shape_json(const std::optional<std::vector<OnnxDim>>& shape) {
  if (!shape) return nullptr;
  nlohmann::json dims = nlohmann::json::array();
  for (const OnnxDim& d : *shape) {
    if (d.is_static())
      dims.push_back(d.value);
    else if (!d.param.empty())
      dims.push_back(d.param);
    else
      dims.push_back(nullptr);
  }
  return dims;
}

nlohmann::json values_json(const ImportGraph& g, const std::vector<int>& ids) {
  nlohmann::json list = nlohmann::json::array();
  for (int id : ids) {
    const ImportValue& v = g.values()[id];
    list.push_back(
        {{"name", v.name}, {"dtype", onnx_elem_type_name(v.type)}, {"shape", shape_json(v.shape)}});
  }
  return list;
}

// What folds before the graph runs with the inputs' declared shapes: constant subgraphs, and
// shape subgraphs where the dimensions they read are numbers (symbolic ones, batch and sequence,
// are known only when `kiln exec` runs the graph on real inputs).
nlohmann::json folding_json(const ImportGraph& g) {
  try {
    const FoldedGraph folded = fold_import_graph(g);
    std::map<std::string, int> ops;
    for (size_t n = 0; n < g.nodes().size(); ++n)
      if (folded.folded[n]) ++ops[g.nodes()[n].qualified_op()];
    int64_t constants = 0, bytes = 0;  // what the remaining nodes read
    for (size_t v = 0; v < g.values().size(); ++v)
      if (folded.known[v].has_data() && g.values()[v].kind != ImportValueKind::kInitializer) {
        ++constants;
        bytes += folded.known[v].numel() * static_cast<int64_t>(folded.known[v].element_bytes());
      }
    return {{"nodes", folded.folded_nodes},
            {"remaining_nodes", folded.remaining.size()},
            {"ops", ops},
            {"constants", constants},
            {"constant_bytes", bytes}};
  } catch (const Error& e) {
    return {{"error", e.what()}};
  }
}

// What lifts into kiln's ops, what does not and why, and whether the whole graph assembles
// into a model that `kiln build --onnx` makes a generation plan of.
nlohmann::json lift_json(const ImportGraph& g) {
  if (!find_unsupported_ops(g).empty()) return {{"error", "the graph has unsupported ops"}};
  try {
    const Logger quiet(LogLevel::kSilent);
    const PatternGraph pattern(g, lift_probe_shapes(g));
    const LiftResult lifted = lift_import_graph(pattern, quiet);
    std::map<std::string, int> kinds, generic;
    nlohmann::json ops = nlohmann::json::array();
    for (const LiftedOp& op : lifted.ops) {
      ++kinds[std::string(lifted_kind_name(op.kind))];
      ops.push_back({{"kind", lifted_kind_name(op.kind)},
                     {"anchor", op.anchor},
                     {"summary", op.summary()},
                     {"nodes", op.nodes.size()}});
    }
    for (int n : lifted.generic_nodes) ++generic[g.nodes()[n].qualified_op()];
    nlohmann::json failures = nlohmann::json::array();
    for (const PatternFailure& f : lifted.failures)
      failures.push_back({{"pattern", f.pattern}, {"node", f.node}, {"reason", f.reason}});
    nlohmann::json model;
    const std::string half = t5_half(g, lifted);
    if (!half.empty()) {
      model = {
          {"architecture", "t5"},
          {"note", half == "decoder" ? "a T5 decoder: kiln build --onnx ENCODER --onnx this file"
                                     : "a T5 encoder: kiln build --onnx this file --onnx DECODER"}};
    } else {
      try {
        const LiftedModel m = assemble_bloom(pattern, lifted, quiet);
        model = {{"architecture", "bloom"}, {"notes", m.notes}};
      } catch (const Error& e) {
        model = {{"error", e.what()}};
      }
    }
    return {{"ops", ops},
            {"counts", kinds},
            {"failures", failures},
            {"generic", generic},
            {"generic_nodes", lifted.generic_nodes.size()},
            {"model", model}};
  } catch (const Error& e) {
    return {{"error", e.what()}};
  }
}

nlohmann::json onnx_report(const OnnxModel& model, const ImportGraph& g) {
  std::map<std::string, int> ops;
  for (const ImportNode& n : g.nodes()) ++ops[n.qualified_op()];
  int64_t init_count = 0, init_bytes = 0, external_bytes = 0;
  for (const ImportValue& v : g.values())
    if (v.kind == ImportValueKind::kInitializer) {
      ++init_count;
      init_bytes += static_cast<int64_t>(v.initializer.bytes);
      if (!v.initializer.external_location.empty())
        external_bytes += static_cast<int64_t>(v.initializer.bytes);
    }
  nlohmann::json unsupported = nlohmann::json::array();
  for (const UnsupportedOp& u : find_unsupported_ops(g))
    unsupported.push_back({{"node", u.node}, {"op", u.op}});
  return {{"source", {{"onnx", model.path}}},
          {"ir_version", model.ir_version},
          {"opset", model.opset},
          {"other_opsets", model.other_opsets},
          {"producer", {{"name", model.producer_name}, {"version", model.producer_version}}},
          {"graph", model.graph.name},
          {"inputs", values_json(g, g.inputs())},
          {"outputs", values_json(g, g.outputs())},
          {"nodes", g.nodes().size()},
          {"ops", ops},
          {"initializers",
           {{"count", init_count}, {"bytes", init_bytes}, {"external_bytes", external_bytes}}},
          {"folded", folding_json(g)},
          {"unsupported_ops", unsupported},
          {"lifted", lift_json(g)}};
}

void print_values(const char* title, const nlohmann::json& values) {
  out("{} ({}):\n", title, values.size());
  for (const auto& v : values) {
    std::string shape = "(unknown rank)";
    if (!v["shape"].is_null()) {
      std::vector<std::string> dims;
      for (const auto& d : v["shape"])
        dims.push_back(d.is_null() ? "?" : d.is_string() ? d.get<std::string>() : d.dump());
      shape = fmt::format("[{}]", fmt::join(dims, ", "));
    }
    out("  {:<32} {:<8} {}\n", v["name"].get<std::string>(), v["dtype"].get<std::string>(), shape);
  }
}

void print_lift(const nlohmann::json& l) {
  if (l.contains("error")) {
    out("lifting: not attempted: {}\n", l["error"].get<std::string>());
    return;
  }
  std::string counts;
  for (const auto& [kind, count] : l["counts"].items())
    counts += fmt::format(" {}×{}", kind, count.get<int>());
  out("lifted into kiln ops:{}\n", counts.empty() ? " none" : counts);
  for (const auto& op : l["ops"])
    if (op["kind"] == "attention")
      out("  {} at '{}'\n", op["summary"].get<std::string>(), op["anchor"].get<std::string>());
  std::string generic;
  for (const auto& [op, count] : l["generic"].items())
    generic += fmt::format(" {}×{}", op, count.get<int>());
  out("not lifted (generic, outside any lifted op): {} nodes{}{}\n", l["generic_nodes"].get<int>(),
      generic.empty() ? "" : ":", generic);
  for (const auto& f : l["failures"])
    out("  pattern {} at '{}' did not match: {}\n", f["pattern"].get<std::string>(),
        f["node"].get<std::string>(), f["reason"].get<std::string>());
  const auto& m = l["model"];
  if (m.contains("error"))
    out("model: does not lift into a generation plan: {}\n", m["error"].get<std::string>());
  else if (m.contains("note"))
    out("model: {}\n", m["note"].get<std::string>());
  else
    for (const auto& note : m["notes"]) out("model: {}\n", note.get<std::string>());
}

void print_report(const nlohmann::json& r) {
  const std::string producer =
      r["producer"]["name"].get<std::string>() + " " + r["producer"]["version"].get<std::string>();
  out("onnx {}\n  IR version {}, opset {}, producer {}\n", r["source"]["onnx"].get<std::string>(),
      r["ir_version"].get<int64_t>(), r["opset"].get<int64_t>(), producer);
  for (const auto& [domain, version] : r["other_opsets"].items())
    out("  also imports {} opset {}\n", domain, version.get<int64_t>());
  const auto& init = r["initializers"];
  out("graph '{}': {} nodes, {} initializers ({:.2f} MiB{})\n", r["graph"].get<std::string>(),
      r["nodes"].get<int64_t>(), init["count"].get<int64_t>(),
      init["bytes"].get<double>() / (1 << 20),
      init["external_bytes"].get<int64_t>() == 0
          ? ""
          : fmt::format(", {:.2f} MiB in external data files",
                        init["external_bytes"].get<double>() / (1 << 20)));
  print_values("inputs", r["inputs"]);
  print_values("outputs", r["outputs"]);
  std::string ops;
  for (const auto& [op, count] : r["ops"].items())
    ops += fmt::format(" {}×{}", op, count.get<int>());
  out("ops:{}\n", ops);
  const auto& folded = r["folded"];
  if (folded.contains("error")) {
    out("folding: failed: {}\n", folded["error"].get<std::string>());
  } else {
    std::string folded_ops;
    for (const auto& [op, count] : folded["ops"].items())
      folded_ops += fmt::format(" {}×{}", op, count.get<int>());
    out("folded at build time (declared input shapes): {} of {} nodes{}{}; {} folded values "
        "({:.1f} "
        "KiB) feed the other {} nodes\n",
        folded["nodes"].get<int>(), r["nodes"].get<int>(), folded_ops.empty() ? "" : ":",
        folded_ops, folded["constants"].get<int64_t>(),
        folded["constant_bytes"].get<double>() / 1024, folded["remaining_nodes"].get<int>());
  }
  const auto& unsupported = r["unsupported_ops"];
  if (unsupported.empty()) {
    out("unsupported ops: none (every op is one kiln imports)\n");
    print_lift(r["lifted"]);
    return;
  }
  std::map<std::string, std::vector<std::string>> by_op;  // op -> node names
  for (const auto& u : unsupported)
    by_op[u["op"].get<std::string>()].push_back(u["node"].get<std::string>());
  out("unsupported ops ({} nodes):\n", unsupported.size());
  for (const auto& [op, nodes] : by_op)
    out("  {}×{}: {}\n", op, nodes.size(), fmt::join(nodes, ", "));
}

}  // namespace

int inspect_onnx(const std::string& path, bool json) {
  KILN_CHECK_USAGE(!path.empty(), "--onnx: the path is empty");
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st))
    KILN_FAIL_KIND(ErrorKind::kNotFound, "--onnx {}: no such file", path);
  KILN_CHECK(!std::filesystem::is_directory(st),
             "--onnx {}: this is a directory; --onnx takes an .onnx file", path);
  const OnnxModel model = read_onnx_model(path);
  const ImportGraph graph = ImportGraph::build(model);
  const nlohmann::json report = onnx_report(model, graph);
  if (json)
    out_line(report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  else
    print_report(report);
  return 0;
}

}  // namespace kiln::cli
