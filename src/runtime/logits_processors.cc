#include "runtime/logits_processors.h"

#include <algorithm>

namespace kiln {

namespace {

bool ends_with(std::span<const int64_t> seq, std::span<const int64_t> tail) {
  return tail.size() <= seq.size() && std::equal(tail.begin(), tail.end(), seq.end() - tail.size());
}

// HF's _get_generated_ngrams: every token that followed, in `source`, the n-1 tokens `sequence`
// ends with (n-grams of `source` only; none while `sequence` is shorter than n-1).
void ban_ngram_continuations(std::span<const int64_t> source, std::span<const int64_t> sequence,
                             int n, std::vector<int64_t>* banned) {
  const size_t prefix = static_cast<size_t>(n - 1);
  if (sequence.size() < prefix || source.size() < static_cast<size_t>(n)) return;
  const std::span<const int64_t> tail = sequence.last(prefix);
  for (size_t i = 0; i + prefix < source.size(); ++i)
    if (std::equal(tail.begin(), tail.end(), source.begin() + static_cast<ptrdiff_t>(i)))
      banned->push_back(source[i + prefix]);
}

}  // namespace

bool eos_banned(const GenerationParams& p, const ProcessorState& s) {
  return s.generated < p.min_new_tokens || static_cast<int64_t>(s.sequence.size()) < p.min_length;
}

bool make_row_edit(const GenerationParams& p, const ProcessorState& s, RowEdit* edit) {
  if (!p.processes_logits()) return false;
  edit->log_softmax = s.beam_search;
  edit->penalty = p.repetition_penalty;
  edit->penalized.clear();
  edit->banned.clear();
  edit->forced.clear();
  edit->suppressed.clear();
  if (p.repetition_penalty != 1.0f) {
    // HF gathers and scatters the sequence's ids: a repeated id is penalised once.
    edit->penalized.assign(s.sequence.begin(), s.sequence.end());
    std::sort(edit->penalized.begin(), edit->penalized.end());
    edit->penalized.erase(std::unique(edit->penalized.begin(), edit->penalized.end()),
                          edit->penalized.end());
  }
  if (p.no_repeat_ngram_size > 0)
    ban_ngram_continuations(s.sequence, s.sequence, p.no_repeat_ngram_size, &edit->banned);
  if (p.encoder_no_repeat_ngram_size > 0)
    ban_ngram_continuations(s.prompt, s.sequence, p.encoder_no_repeat_ngram_size, &edit->banned);
  for (const std::vector<int64_t>& words : p.bad_words_ids) {
    // HF drops a bad word that is one EOS id, and ignores one longer than the sequence (even
    // when its prefix would match).
    if (words.size() == 1 &&
        std::find(s.eos_ids.begin(), s.eos_ids.end(), words[0]) != s.eos_ids.end())
      continue;
    if (words.size() > s.sequence.size()) continue;
    if (ends_with(s.sequence, std::span<const int64_t>(words).first(words.size() - 1)))
      edit->banned.push_back(words.back());
  }
  if (eos_banned(p, s)) edit->banned.insert(edit->banned.end(), s.eos_ids.begin(), s.eos_ids.end());
  std::sort(edit->banned.begin(), edit->banned.end());
  edit->banned.erase(std::unique(edit->banned.begin(), edit->banned.end()), edit->banned.end());
  // Forced EOS comes after forced BOS in HF's list: where both apply, EOS is what is left.
  if (!p.forced_eos_token_ids.empty() && s.generated + 1 == s.max_new)
    edit->forced = p.forced_eos_token_ids;
  else if (p.forced_bos_token_id >= 0 && s.sequence.size() == 1)
    edit->forced = {p.forced_bos_token_id};
  edit->suppressed = p.suppress_tokens;
  return true;
}

}  // namespace kiln
