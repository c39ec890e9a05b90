#include "runtime/encoder_run.h"

#include <string>

namespace kiln {

EncoderIo EncoderIo::of(const Graph& encoder, int layers) {
  EncoderIo io;
  io.input_ids = encoder.input_index("input_ids");
  io.hidden = encoder.output_index("encoder_hidden");
  for (int l = 0; l < layers; ++l) {
    io.cross_k.push_back(encoder.output_index("cross_k." + std::to_string(l)));
    io.cross_v.push_back(encoder.output_index("cross_v." + std::to_string(l)));
  }
  return io;
}

namespace {

// The streamed encoder's outputs, taken as they are written: each cross K/V projection into
// every sequence's buffer (part 2l: layer l's K, 2l + 1: its V), the states to the host.
class CrossKvSink final : public OutputSink {
 public:
  CrossKvSink(HostRowGroups& groups, std::vector<int> part_of_output, Allocator& memory, int hidden,
              Tensor* hidden_out)
      : groups_(groups),
        part_of_output_(std::move(part_of_output)),
        memory_(memory),
        hidden_(hidden),
        hidden_out_(hidden_out) {}
  void take(int output, const Tensor& value) override {
    if (output == hidden_ && hidden_out_ != nullptr) *hidden_out_ = memory_.to_host(value);
    const int part = part_of_output_.at(static_cast<size_t>(output));
    if (part >= 0) groups_.fill(static_cast<size_t>(part), value);
  }

 private:
  HostRowGroups& groups_;
  std::vector<int> part_of_output_;
  Allocator& memory_;
  int hidden_;
  Tensor* hidden_out_;
};

}  // namespace

std::vector<std::shared_ptr<CrossKv>> run_encoder(Executable& encoder, const Graph& graph,
                                                  const EncoderIo& io, Backend& backend,
                                                  Precision precision,
                                                  std::span<const Tensor> inputs, StepContext step,
                                                  Tensor* hidden, Allocator* cross_memory,
                                                  int sequences) {
  KILN_CHECK(
      step.layout != nullptr && !io.cross_k.empty() && io.cross_k.size() == io.cross_v.size(),
      "run_encoder: needs the step's layout and each layer's cross K/V outputs");
  const int seqs = step.layout->num_seqs();
  KILN_CHECK(sequences <= seqs, "run_encoder: cross K/V for {} of the step's {} sequences",
             sequences, seqs);
  const std::vector<int64_t> bounds(
      step.layout->token_begin.begin(),
      step.layout->token_begin.begin() + (sequences < 0 ? seqs : sequences) + 1);
  // The parts in each sequence's buffer: every layer's K, then its V.
  std::vector<int> parts;
  for (size_t l = 0; l < io.cross_k.size(); ++l) {
    parts.push_back(io.cross_k[l]);
    parts.push_back(io.cross_v[l]);
  }
  const DType compute = graph.values[graph.outputs[io.cross_k[0]]].dtype;
  const DType cross_dtype = backend.kv_cache_dtype(compute, precision, KvCache::kAuto);
  Allocator& memory = cross_memory != nullptr ? *cross_memory : backend.allocator();
  std::vector<std::vector<Tensor>> copies;
  if (graph.streams_outputs()) {
    std::vector<Shape> row_shapes;
    std::vector<int> part_of_output(graph.outputs.size(), -1);
    for (size_t p = 0; p < parts.size(); ++p) {
      KILN_CHECK(graph.streams_output(static_cast<size_t>(parts[p])),
                 "graph '{}': output {} is not streamed while others are", graph.name, parts[p]);
      part_of_output[static_cast<size_t>(parts[p])] = static_cast<int>(p);
      const SymShape& shape = graph.values[graph.outputs[parts[p]]].shape;
      Shape row;
      for (size_t d = 1; d < shape.size(); ++d) {
        KILN_CHECK(!shape[d].is_symbolic(), "graph '{}': cross K/V rows of symbolic width",
                   graph.name);
        row.push_back(shape[d].value);
      }
      row_shapes.push_back(std::move(row));
    }
    HostRowGroups groups(memory, std::move(row_shapes), bounds, cross_dtype);
    CrossKvSink sink(groups, std::move(part_of_output), backend.allocator(), io.hidden, hidden);
    step.sink = &sink;
    encoder.execute(inputs, &step);
    copies = groups.take();
  } else {
    const std::span<const Tensor> out = encoder.execute(inputs, &step);
    std::vector<Tensor> sources;
    sources.reserve(parts.size());
    for (int o : parts) sources.push_back(out[o]);
    copies = memory.copy_row_groups_as(sources, bounds, cross_dtype);
    if (hidden != nullptr) *hidden = backend.allocator().to_host(out[io.hidden]);
  }
  std::vector<std::shared_ptr<CrossKv>> cross;
  cross.reserve(copies.size());
  for (std::vector<Tensor>& seq : copies) {
    auto kv = std::make_shared<CrossKv>();
    kv->keys.reserve(io.cross_k.size());
    kv->values.reserve(io.cross_k.size());
    for (size_t l = 0; l < io.cross_k.size(); ++l) {
      kv->keys.push_back(std::move(seq[2 * l]));
      kv->values.push_back(std::move(seq[2 * l + 1]));
    }
    cross.push_back(std::move(kv));
  }
  return cross;
}

}  // namespace kiln
