// A small pattern-matching utility over the import graph, what lifting (lift_ops.h) is written
// with: who produces and who reads a value, Cast/Identity looked through, constants as the
// build-time fold knows them, shapes as a probe fold (concrete input dimensions) infers them,
// the region of nodes between two values, and a region run on probe data (the interpreter's own
// kernels) so that a matched subgraph can be checked to compute what its lifted op computes.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "frontend/onnx/fold_import_graph.h"
#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/import_tensor.h"

namespace kiln {

// Why a pattern did not match, where: what `kiln inspect --onnx` and `kiln build --onnx` print.
struct PatternFailure {
  std::string pattern;  // "attention", "gelu", ...
  std::string node;     // the anchor node's name
  std::string reason;
};

class PatternGraph {
 public:
  // `probe_shapes`: concrete dimensions for every runtime input (distinct sizes, so that a
  // dimension's origin can be told from the shapes): the probe fold's shapes. Constants come
  // from a fold with the declared shapes, so that nothing computed from a symbolic dimension
  // (position tables, masks) is mistaken for a constant.
  PatternGraph(const ImportGraph& graph, const std::map<std::string, Shape>& probe_shapes);

  const ImportGraph& graph() const { return graph_; }
  const ImportNode& node(int n) const { return graph_.nodes()[n]; }
  const std::string& value_name(int v) const { return graph_.values()[v].name; }

  // The value itself or, through Cast and Identity nodes and overflow clamps, the value they
  // copy.
  int through_casts(int v) const;
  // HF T5's fp16 overflow guard (T5Block: clamp_value = where(isinf(h).any(), max - 1000, max);
  // h = clamp(h, -clamp_value, clamp_value)): a Clip whose bounds are computed from its own
  // input alone, through IsInf, reductions, comparisons, Where, Neg and Casts, and are -b and b
  // with b within 2000 of fp16's largest value on finite data. It changes nothing unless a value
  // passes +-64504, which a plan that keeps T5's residual stream in f32 (precision_plan.h) never
  // needs: lifting looks through it. Empty for a node that is not one; else the Clip and the
  // nodes computing its bounds.
  const std::vector<int>& overflow_clamp(int n) const { return clamps_[n]; }
  // The node that computes `v` (Cast/Identity looked through), -1 for a graph input, an
  // initializer or a constant.
  int producer(int v) const;
  // producer(v) when its op type is `op`, else -1.
  int producer_if(int v, std::string_view op) const;
  // The nodes that read `v`, in graph order.
  const std::vector<int>& users(int v) const { return users_[v]; }
  // users(v) without Shape nodes (which read only the shape).
  std::vector<int> data_users(int v) const;
  // The only user of `v` whose op is `op` (Cast/Identity users looked through), -1 otherwise.
  int sole_user(int v, std::string_view op) const;

  // The constant value of `v` (an initializer, a Constant node, or folded from them), or null.
  const ImportTensor* constant(int v) const;
  // A one-element numeric constant.
  std::optional<double> scalar(int v) const;
  // For a binary node: the index of the input that is not the constant one; -1 when neither
  // or both are constant.
  int non_constant_input(int n) const;

  // The probe fold's shape of `v` (empty optional when unknown).
  std::optional<Shape> probe_shape(int v) const;
  // Its element type there (kUndefined when unknown).
  OnnxElemType probe_type(int v) const;

  // Non-constant nodes that `v` depends on (its producer and theirs, transitively).
  std::vector<int> upstream_nodes(int v) const;
  // Whether any node in upstream_nodes(v) has op type `op`.
  bool upstream_has(int v, std::string_view op) const;
  // Whether `v` depends on the graph input named `input`.
  bool depends_on_input(int v, const std::string& input) const;
  // The nodes on a path from `from` to `to` (both values), in graph order. Empty when `to`
  // does not depend on `from`.
  std::vector<int> region(int from, int to) const;
  // True when no value computed inside `nodes` is read outside them, except `output` and
  // copies (Cast/Identity) of `input`.
  bool region_is_closed(const std::vector<int>& nodes, int output, int input = -1) const;
  // Runs `nodes` (a region from `input` to `output`) with `input` bound to `x` and returns
  // `output`. Constants are read from the fold.
  ImportTensor run_region(const std::vector<int>& nodes, int input, const ImportTensor& x,
                          int output) const;
  // Computes `v` on probe data: the values in `bound` as given, every other graph input at the
  // probe shape (integer inputs all ones, as an attention mask without padding; float inputs
  // zeros), constants from the fold. What `v` depends on beyond bound values is run.
  ImportTensor evaluate(int v, const std::map<int, ImportTensor>& bound) const;
  // The nodes `v` depends on, not looking past `stops` (values), constants, and with
  // `stop_at_probe_data` values the probe fold computed, in graph order.
  std::vector<int> nodes_between(int v, const std::vector<int>& stops,
                                 bool stop_at_probe_data = false) const;
  const std::map<std::string, Shape>& probe_shapes() const { return probe_shapes_; }

 private:
  const ImportGraph& graph_;
  std::map<std::string, Shape> probe_shapes_;
  FoldedGraph constants_, probe_;
  std::vector<std::vector<int>> users_;
  std::vector<std::vector<int>> clamps_;  // per node: overflow_clamp(n)

  void find_overflow_clamps();
};

// A 2-D constant [rows, cols] transposed to [cols, rows] (MatMul's B [in, out] to a Linear's
// [out, in]) as a kiln tensor of the same element type. Under a build's weight spill
// (io/weight_spill.h) the copy goes to the spill file as soon as it is made, so that lifting a
// multi-GB export holds one transposed weight in memory at a time, not all of them.
Tensor transposed_2d(const ImportTensor& t);

}  // namespace kiln
