#include "graph/verifier.h"
#include "passes/pass.h"

namespace kiln {

void optimize_model(ModelIR& model, const PassOptions& options, const Logger& log) {
  for (Graph& g : model.graphs) {
    if (options.fold_constants) fold_constants(g, log);
    eliminate_dead(g, log);
    if (options.fuse) {
      fuse_linear_activation(g, log);
      fuse_add_rms_norm(g, log);
    }
    verify_graph(g);
    // Report memory for one 128-token prompt needing one row of logits.
    plan_memory(g, log, {{"tokens", 128}, {"rows", 1}});
  }
}

}  // namespace kiln
