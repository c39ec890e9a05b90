// The scheduler's encoder steps (encoder-decoder models): joining requests encoded in batches
// within the step's token budget, an encoder step left unchecked on a backend that runs ahead,
// and what is redone when its check fails.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/encoder_run.h"
#include "runtime/scheduler.h"
#include "runtime/scheduler_request.h"

namespace kiln {

// Runs the encoder over the joining requests in batches within the step's token budget. A batch
// that fails is retried one request at a time, so one bad request does not fail the others.
void Scheduler::encode(std::vector<Request*>& joining, std::vector<GenerationEvent>& events) {
  // One request alone, checked; an error fails it.
  auto encode_alone = [&](Request* r) {
    try {
      encode_batch({r}, true);
    } catch (const std::exception& e) {
      fail(*r, fmt::format("encoder failed: {}", e.what()), events);
    }
  };
  size_t begin = 0;
  while (begin < joining.size()) {
    // Only the last batch is left unchecked: an earlier one is checked before the next runs, and
    // if its check fails its requests are encoded again one at a time.
    const std::vector<Request*> earlier(joining.begin(),
                                        joining.begin() + static_cast<ptrdiff_t>(begin));
    check_encoder(earlier, events);
    for (Request* r : earlier)
      if (!r->done && !r->cross) encode_alone(r);
    size_t end = begin;
    int64_t tokens = 0;
    while (end < joining.size() &&
           (end == begin ||
            tokens + static_cast<int64_t>(joining[end]->prompt.size()) <= options_.max_step_tokens))
      tokens += static_cast<int64_t>(joining[end++]->prompt.size());
    std::vector<Request*> batch(joining.begin() + static_cast<ptrdiff_t>(begin),
                                joining.begin() + static_cast<ptrdiff_t>(end));
    try {
      encode_batch(batch, false);
    } catch (const std::exception& batch_error) {
      // What the failed batch queued is redone below: a check of it still pending is not the
      // retries' to report.
      try {
        model_.backend().wait();
      } catch (const std::exception&) {
      }
      for (Request* r : batch) encode_alone(r);
    }
    begin = end;
  }
  std::erase_if(running_, [](const std::unique_ptr<Request>& r) { return r->done; });
}

void Scheduler::encode_batch(const std::vector<Request*>& batch, bool checked) {
  const EncoderIo& io = model_.encoder_io();
  StepLayout layout;
  layout.clear();
  std::vector<int64_t> ids;
  for (Request* r : batch) {
    layout.add_sequence(static_cast<int64_t>(r->prompt.size()), 0, {}, nullptr);
    ids.insert(ids.end(), r->prompt.begin(), r->prompt.end());
  }
  // On a backend that keeps state per step shape (CUDA: a graph per replayed shape, and for
  // every row count each Linear's cuBLASLt algorithm, chosen by a heuristic query on the host the
  // first time), the step is padded to a multiple of encode_pad_tokens with a sequence of its own
  // (its outputs are not kept): encoder steps then repeat a few shapes instead of one per sum of
  // prompt lengths, whatever their size.
  const int64_t replayed = model_.backend().replayed_step_tokens();
  const int64_t tokens = static_cast<int64_t>(ids.size());
  const int64_t pad = options_.encode_pad_tokens;
  if (pad > 0 && replayed > 0 && tokens % pad != 0 &&
      static_cast<int64_t>(batch.size()) < model_.model().profile.max_batch) {
    const int64_t padded = std::min((tokens + pad - 1) / pad * pad, options_.max_step_tokens);
    if (padded > tokens) {
      layout.add_sequence(padded - tokens, 0, {}, nullptr);
      ids.resize(static_cast<size_t>(padded), model_.desc().pad_token_id);
    }
  }
  const Graph& graph = model_.model().graph(kEncoderGraph);
  std::vector<Tensor> inputs(graph.inputs.size());
  inputs[io.input_ids] = Tensor::from_vector(ids, {static_cast<int64_t>(ids.size())});
  StepContext step{&layout, nullptr};
  step.read_on_device = run_ahead_ && !checked;
  std::vector<std::shared_ptr<CrossKv>> cross =
      run_encoder(model_.encoder(), graph, io, model_.backend(), model_.model().precision, inputs,
                  step, nullptr, cross_pool_.get(), static_cast<int>(batch.size()));
  ++encoder_steps_;
  for (size_t i = 0; i < batch.size(); ++i) batch[i]->cross = std::move(cross[i]);
  if (step.read_on_device)
    for (const Request* r : batch) unchecked_cross_.push_back(r->id);
}

void Scheduler::check_encoder(const std::vector<Request*>& redo,
                              std::vector<GenerationEvent>& events) {
  if (unchecked_cross_.empty()) return;
  try {
    model_.backend().wait();
    unchecked_cross_.clear();
  } catch (const std::exception& e) {
    distrust_unchecked(redo, e.what(), events);
  }
}

void Scheduler::distrust_unchecked(const std::vector<Request*>& redo, const std::string& error,
                                   std::vector<GenerationEvent>& events) {
  auto listed = [&](const Request& r) {
    return std::find(unchecked_cross_.begin(), unchecked_cross_.end(), r.id) !=
           unchecked_cross_.end();
  };
  for (auto& r : waiting_)
    if (listed(*r)) r->cross.reset();
  for (auto& r : running_) {
    if (!r || r->done || !listed(*r)) continue;
    if (std::find(redo.begin(), redo.end(), r.get()) != redo.end())
      r->cross.reset();
    else
      fail(*r, fmt::format("encoder failed: {}", error), events);
  }
  unchecked_cross_.clear();
}

}  // namespace kiln
