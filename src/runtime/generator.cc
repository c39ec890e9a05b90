#include "runtime/generator.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "runtime/sampler.h"

namespace kiln {

Generator::Generator(Engine& engine)
    : engine_(engine), cache_(engine.model().cache_layers(), engine.model().cache_row_width()) {
  eos_ids_ = engine.model().config.generation.eos_token_ids;
  if (eos_ids_.empty()) eos_ids_.push_back(engine.model().eos_token_id());
}

Generator::~Generator() {
  for (auto& r : running_)
    for (Beam& b : r->beams) b.kv.release(cache_);
}

bool Generator::is_eos(int64_t token) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
}

Generator::RequestId Generator::submit(std::vector<int64_t> prompt_ids,
                                       const GenerationParams& params) {
  validate(params);
  const ModelIR& m = engine_.model();
  KILN_CHECK_USAGE(!prompt_ids.empty(), "empty prompt: nothing to generate from");
  KILN_CHECK_USAGE(static_cast<int64_t>(prompt_ids.size()) <= m.max_input_tokens,
                   "prompt is {} tokens; this model allows at most {} (set at build time with "
                   "--max-input-tokens)",
                   prompt_ids.size(), m.max_input_tokens);
  for (int64_t id : prompt_ids)
    KILN_CHECK_USAGE(id >= 0 && id < m.vocab_size(), "prompt token id {} is outside [0, {})", id,
                     m.vocab_size());
  auto r = std::make_unique<Request>();
  r->id = next_id_++;
  r->params = params;
  r->prompt = std::move(prompt_ids);
  r->rng.seed(params.seed);
  waiting_.push_back(std::move(r));
  return waiting_.back()->id;
}

// Runs the encoder once over every joining request (ragged batch) and starts their first beam.
void Generator::admit_waiting() {
  if (waiting_.empty()) return;
  const ModelIR& m = engine_.model();
  std::vector<std::unique_ptr<Request>> joining;
  while (!waiting_.empty()) {
    joining.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (m.is_encoder_decoder()) {
    std::vector<int64_t> ids;
    AttentionBatch batch;
    for (auto& r : joining) {
      SequenceSlot s;
      s.token_begin = static_cast<int64_t>(ids.size());
      s.num_tokens = static_cast<int64_t>(r->prompt.size());
      batch.seqs.push_back(s);
      ids.insert(ids.end(), r->prompt.begin(), r->prompt.end());
    }
    TensorMap in;
    in["input_ids"] = Tensor::from_vector(ids, {static_cast<int64_t>(ids.size())});
    const TensorMap out = engine_.encoder().execute(in, &batch);
    const int layers = m.cache_layers();
    for (size_t i = 0; i < joining.size(); ++i) {
      auto cross = std::make_shared<CrossKv>();
      const SequenceSlot& s = batch.seqs[i];
      for (int l = 0; l < layers; ++l) {
        cross->keys.push_back(out.at("cross_k." + std::to_string(l))
                                  .slice_rows(s.token_begin, s.token_begin + s.num_tokens));
        cross->values.push_back(out.at("cross_v." + std::to_string(l))
                                    .slice_rows(s.token_begin, s.token_begin + s.num_tokens));
      }
      joining[i]->cross = std::move(cross);
    }
  }
  for (auto& r : joining) {
    Beam b;
    b.feed = m.is_encoder_decoder() ? std::vector<int64_t>{m.config.t5().decoder_start_token_id}
                                    : r->prompt;
    r->beams.push_back(std::move(b));
    running_.push_back(std::move(r));
  }
}

int Generator::step() {
  admit_waiting();
  if (running_.empty()) return 0;
  // Make room in the cache for this step's tokens first, then take block-table views (the
  // tables do not change until the next step).
  std::vector<int64_t> ids, rows;
  for (auto& r : running_)
    for (Beam& b : r->beams) b.kv.prepare_append(cache_, static_cast<int64_t>(b.feed.size()));
  AttentionBatch batch;
  batch.cache = &cache_;
  for (auto& r : running_) {
    for (Beam& b : r->beams) {
      SequenceSlot s;
      s.token_begin = static_cast<int64_t>(ids.size());
      s.num_tokens = static_cast<int64_t>(b.feed.size());
      s.past_len = b.kv.length();
      s.blocks = b.kv.blocks();
      s.cross = r->cross.get();
      batch.seqs.push_back(s);
      ids.insert(ids.end(), b.feed.begin(), b.feed.end());
      rows.push_back(static_cast<int64_t>(ids.size()) - 1);
    }
  }
  TensorMap in;
  in["input_ids"] = Tensor::from_vector(ids, {static_cast<int64_t>(ids.size())});
  in["logit_rows"] = Tensor::from_vector(rows, {static_cast<int64_t>(rows.size())});
  const TensorMap out = engine_.decoder().execute(in, &batch);
  const Tensor& logits = out.at("logits");
  const int64_t vocab = logits.dim(1);
  for (auto& r : running_)
    for (Beam& b : r->beams) {
      b.kv.commit(static_cast<int64_t>(b.feed.size()));
      b.feed.clear();
    }

  const int stepped = static_cast<int>(batch.seqs.size());
  int64_t row = 0;
  std::vector<std::unique_ptr<Request>> still_running;
  for (auto& r : running_) {
    const int64_t first = row;
    row += static_cast<int64_t>(r->beams.size());
    advance(*r, logits.data<float>(), vocab, first);
    if (!r->beams.empty()) still_running.push_back(std::move(r));
  }
  running_ = std::move(still_running);
  return stepped;
}

void Generator::finish(Request& r, GenerationResult result) {
  for (Beam& b : r.beams) b.kv.release(cache_);
  r.beams.clear();
  done_.emplace_back(r.id, std::move(result));
}

void Generator::advance(Request& r, const float* logits, int64_t vocab, int64_t first_row) {
  if (r.params.num_beams > 1) {
    advance_beams(r, logits, vocab, first_row);
    return;
  }
  Beam& b = r.beams[0];
  const std::span<const float> row(logits + first_row * vocab, static_cast<size_t>(vocab));
  const int64_t token = r.params.do_sample ? sample_token(row, r.params, r.rng) : argmax(row);
  if (is_eos(token)) {
    finish(r, GenerationResult{b.tokens, FinishReason::kEos, 0.0f});
    return;
  }
  b.tokens.push_back(token);
  if (static_cast<int64_t>(b.tokens.size()) >= r.params.max_new_tokens) {
    finish(r, GenerationResult{b.tokens, FinishReason::kLength, 0.0f});
    return;
  }
  b.feed.push_back(token);
}

// HF beam search: candidates are the top 2*num_beams (beam, token) continuations by cumulative
// log-probability; those among the top num_beams that end (EOS or max length) become finished
// hypotheses scored sum_logprobs / generated_len^length_penalty (the best num_beams are kept);
// the best num_beams that do not end keep running. With early_stopping, the request ends once
// num_beams hypotheses are finished.
void Generator::advance_beams(Request& r, const float* logits, int64_t vocab, int64_t first_row) {
  const int nb = r.params.num_beams;
  const size_t keep = static_cast<size_t>(2 * nb);
  struct Candidate {
    float score;
    int beam;
    int64_t token;
  };
  std::vector<Candidate> cands;
  std::vector<float> lp;
  for (size_t bi = 0; bi < r.beams.size(); ++bi) {
    log_softmax(std::span<const float>(logits + (first_row + static_cast<int64_t>(bi)) * vocab,
                                       static_cast<size_t>(vocab)),
                &lp);
    // Only this beam's best `keep` tokens can make the overall top `keep`.
    std::vector<int64_t> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = std::min(keep, idx.size());
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
      return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
    });
    for (size_t j = 0; j < k; ++j)
      cands.push_back({r.beams[bi].score + lp[idx[j]], static_cast<int>(bi), idx[j]});
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
  if (cands.size() > keep) cands.resize(keep);

  const int64_t new_len = static_cast<int64_t>(r.beams[0].tokens.size()) + 1;
  const bool at_max = new_len >= r.params.max_new_tokens;
  const bool full = static_cast<int>(r.finished.size()) >= nb && r.params.early_stopping;
  const float norm =
      static_cast<float>(std::pow(static_cast<double>(new_len), r.params.length_penalty));
  std::vector<Beam> next;
  for (size_t rank = 0; rank < cands.size(); ++rank) {
    const Candidate& c = cands[rank];
    const bool eos = is_eos(c.token);
    if (eos || at_max) {
      if (static_cast<int>(rank) < nb && !full) {
        Hypothesis h{r.beams[c.beam].tokens, c.score / norm, eos};
        if (!eos) h.tokens.push_back(c.token);
        r.finished.push_back(std::move(h));
      }
      continue;
    }
    if (static_cast<int>(next.size()) >= nb) continue;
    Beam b;
    b.tokens = r.beams[c.beam].tokens;
    b.tokens.push_back(c.token);
    b.feed.push_back(c.token);
    b.score = c.score;
    b.kv = r.beams[c.beam].kv.fork(cache_);
    next.push_back(std::move(b));
  }
  std::stable_sort(r.finished.begin(), r.finished.end(),
                   [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
  if (static_cast<int>(r.finished.size()) > nb) r.finished.resize(static_cast<size_t>(nb));
  for (Beam& b : r.beams) b.kv.release(cache_);
  r.beams = std::move(next);

  const bool done = at_max || r.beams.empty() ||
                    (r.params.early_stopping && static_cast<int>(r.finished.size()) >= nb);
  if (done) {
    KILN_CHECK(!r.finished.empty(), "beam search ended without a hypothesis");
    const Hypothesis& best = r.finished.front();
    finish(r, GenerationResult{best.tokens, best.eos ? FinishReason::kEos : FinishReason::kLength,
                               best.score});
  }
}

std::vector<std::pair<Generator::RequestId, GenerationResult>> Generator::take_finished() {
  return std::exchange(done_, {});
}

std::vector<GenerationResult> Generator::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                  const GenerationParams& params) {
  std::map<RequestId, size_t> order;
  for (size_t i = 0; i < prompts.size(); ++i) order[submit(prompts[i], params)] = i;
  std::vector<GenerationResult> results(prompts.size());
  size_t received = 0;
  while (received < prompts.size()) {
    step();
    for (auto& [id, res] : take_finished()) {
      auto it = order.find(id);
      if (it == order.end()) continue;
      results[it->second] = std::move(res);
      ++received;
    }
  }
  return results;
}

}  // namespace kiln
