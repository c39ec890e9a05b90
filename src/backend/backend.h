// The backend interface: a backend says which nodes it supports, compiles a graph into an
// executable, and executes it on a step's inputs. CPU and CUDA implement it; the same graph
// runs on either.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "backend/attention_batch.h"
#include "backend/cuda_info.h"
#include "core/context.h"
#include "graph/ir.h"

namespace kiln {

using TensorMap = std::map<std::string, Tensor>;

class Executable {
 public:
  virtual ~Executable() = default;
  // Feeds every graph input by name; returns every graph output by name. `batch` is required
  // when the graph has Attention nodes. Outputs are freshly allocated (the caller keeps them).
  virtual TensorMap execute(const TensorMap& inputs, const AttentionBatch* batch) = 0;
  // Bytes of activation buffers currently held (grows to the largest step seen).
  virtual int64_t activation_bytes() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string describe() const = 0;
  // Empty when supported; otherwise why not (dtype, attribute...).
  virtual std::string unsupported_reason(const Graph& graph, const Node& node) const = 0;
  bool supports_op(const Graph& graph, const Node& node) const {
    return unsupported_reason(graph, node).empty();
  }
  // Throws naming the first unsupported node.
  virtual std::unique_ptr<Executable> compile(const Graph& graph) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(Context& ctx);

}  // namespace kiln
