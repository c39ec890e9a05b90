// HF's logits processors as row edits (runtime/logits_processors.h) and their host application
// (backend.h's edit_logits_row): each expectation is HF's rule worked by hand
// (transformers/generation/logits_process.py), not what the code printed.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "core/context.h"
#include "core/status.h"
#include "runtime/logits_processors.h"

namespace kiln {
namespace {

constexpr float kNegInf = -INFINITY;

struct Seq {
  std::vector<int64_t> sequence;
  std::vector<int64_t> prompt;
  std::vector<int64_t> eos{1};
  int64_t generated = 0;
  int64_t max_new = 16;
  bool beam = false;
  ProcessorState state() const {
    ProcessorState s;
    s.sequence = sequence;
    s.prompt = prompt;
    s.generated = generated;
    s.max_new = max_new;
    s.eos_ids = eos;
    s.beam_search = beam;
    return s;
  }
};

RowEdit edit_of(const GenerationParams& p, const Seq& s) {
  RowEdit e;
  EXPECT_TRUE(make_row_edit(p, s.state(), &e));
  return e;
}

TEST(LogitsProcessors, NothingToDoWithoutProcessors) {
  GenerationParams p;
  p.min_new_tokens = 5;  // an EOS ban alone stays with the selection kernels
  RowEdit e;
  EXPECT_FALSE(make_row_edit(p, Seq{{0}}.state(), &e));
  EXPECT_TRUE(eos_banned(p, Seq{{0}}.state()));
}

TEST(LogitsProcessors, RepetitionPenaltyOncePerDistinctIdBothSigns) {
  GenerationParams p;
  p.repetition_penalty = 2.0f;
  const RowEdit e = edit_of(p, Seq{{5, 3, 5, 7}});
  EXPECT_EQ(e.penalized, (std::vector<int64_t>{3, 5, 7}));
  std::vector<float> row = {1, 1, 1, -1, 1, 4, 1, 0};
  edit_logits_row(row, e);
  // Negative logits are multiplied, others divided; 0 stays 0; ids not in the sequence keep theirs.
  EXPECT_EQ(row, (std::vector<float>{1, 1, 1, -2, 1, 2, 1, 0}));
}

TEST(LogitsProcessors, NoRepeatNgramBansWhatFollowedTheLastNMinusOneTokens) {
  GenerationParams p;
  p.no_repeat_ngram_size = 2;
  EXPECT_EQ(edit_of(p, Seq{{4, 5, 4}}).banned, (std::vector<int64_t>{5}));
  p.no_repeat_ngram_size = 3;
  EXPECT_EQ(edit_of(p, Seq{{1, 2, 3, 1, 2}}).banned, (std::vector<int64_t>{3}));
  // Shorter than n - 1: nothing to match.
  EXPECT_TRUE(edit_of(p, Seq{{1}}).banned.empty());
  // n = 1: every token of the sequence.
  p.no_repeat_ngram_size = 1;
  EXPECT_EQ(edit_of(p, Seq{{9, 4, 9}}).banned, (std::vector<int64_t>{4, 9}));
}

TEST(LogitsProcessors, EncoderNoRepeatNgramUsesThePromptsNgrams) {
  GenerationParams p;
  p.encoder_no_repeat_ngram_size = 2;
  Seq s{{0, 10}, {10, 11, 12, 10, 13}};
  EXPECT_EQ(edit_of(p, s).banned, (std::vector<int64_t>{11, 13}));
  p.encoder_no_repeat_ngram_size = 1;
  EXPECT_EQ(edit_of(p, s).banned, (std::vector<int64_t>{10, 11, 12, 13}));
  p.encoder_no_repeat_ngram_size = 3;
  s.sequence = {0, 11, 12};  // (11, 12) never followed by anything in the prompt but 10
  EXPECT_EQ(edit_of(p, s).banned, (std::vector<int64_t>{10}));
}

TEST(LogitsProcessors, BadWordsFollowHfsRules) {
  GenerationParams p;
  // A lone id always; the last id of a longer one where the others end the sequence; a lone EOS
  // is dropped (HF filters it out); one longer than the sequence is ignored even when its
  // prefix would match (HF's "sequence is longer than the context").
  p.bad_words_ids = {{9}, {2, 8}, {1}, {0, 6}, {3, 2, 7}};
  EXPECT_EQ(edit_of(p, Seq{{0}}).banned, (std::vector<int64_t>{9}));
  EXPECT_EQ(edit_of(p, Seq{{0, 2}}).banned, (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(edit_of(p, Seq{{3, 2}}).banned, (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(edit_of(p, Seq{{4, 3, 2}}).banned, (std::vector<int64_t>{7, 8, 9}));
}

TEST(LogitsProcessors, MinimumLengthsBanEosInsideTheEdit) {
  GenerationParams p;
  p.suppress_tokens = {7};
  p.min_new_tokens = 2;
  Seq s{{0, 4}};
  s.generated = 1;
  EXPECT_EQ(edit_of(p, s).banned, (std::vector<int64_t>{1}));
  s.generated = 2;
  EXPECT_TRUE(edit_of(p, s).banned.empty());
  p.min_new_tokens = 0;
  p.min_length = 3;  // counts the whole sequence (HF's input_ids)
  EXPECT_EQ(edit_of(p, s).banned, (std::vector<int64_t>{1}));
  s.sequence = {0, 4, 5};
  EXPECT_TRUE(edit_of(p, s).banned.empty());
}

TEST(LogitsProcessors, ForcedTokensThenSuppression) {
  GenerationParams p;
  p.forced_bos_token_id = 3;
  p.forced_eos_token_ids = {1, 2};
  Seq s{{0}};
  s.max_new = 4;
  EXPECT_EQ(edit_of(p, s).forced, (std::vector<int64_t>{3}));  // one token long: BOS
  s.sequence = {0, 3, 5};
  s.generated = 2;
  EXPECT_TRUE(edit_of(p, s).forced.empty());
  s.generated = 3;  // the last new token: EOS (every id of the list)
  EXPECT_EQ(edit_of(p, s).forced, (std::vector<int64_t>{1, 2}));
  // Both apply: forced EOS comes later in HF's list and wins.
  s.sequence = {0};
  s.max_new = 1;
  s.generated = 0;
  EXPECT_EQ(edit_of(p, s).forced, (std::vector<int64_t>{1, 2}));
  // Forcing replaces the row (bans included); suppression comes after it.
  RowEdit e;
  e.banned = {1};
  e.forced = {1, 2};
  e.suppressed = {2};
  std::vector<float> row = {5, 6, 7, 8};
  edit_logits_row(row, e);
  EXPECT_EQ(row, (std::vector<float>{kNegInf, 0, kNegInf, kNegInf}));
}

TEST(LogitsProcessors, BeamRowsAreLogSoftmaxedBeforeTheEdits) {
  RowEdit e;
  e.log_softmax = true;
  e.penalty = 2.0f;
  e.penalized = {0};
  std::vector<float> row = {0.0f, std::log(3.0f)};
  edit_logits_row(row, e);
  // log(1/4) * 2 (a log-probability is negative: multiplied), log(3/4).
  EXPECT_NEAR(row[0], 2.0 * std::log(0.25), 1e-6);
  EXPECT_NEAR(row[1], std::log(0.75), 1e-6);
}

TEST(BadInputLogitEdits, RowsAndIdsOutsideTheLogitsAreRefused) {
  Context ctx(ContextOptions{LogLevel::kError, 1});
  const auto backend = make_cpu_backend(ctx);
  Tensor logits = Tensor::empty(DType::kF32, {2, 8});
  RowEdit bad_row;
  bad_row.row = 2;
  RowEdit bad_id;
  bad_id.banned = {8};
  RowEdit bad_penalty;
  bad_penalty.penalty = 0.0f;
  for (const RowEdit& e : {bad_row, bad_id, bad_penalty}) {
    try {
      backend->token_selector().edit_logits_rows(logits, std::span<const RowEdit>(&e, 1));
      ADD_FAILURE() << "accepted a bad edit";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("edit_logits_rows"), std::string::npos) << err.what();
    }
  }
}

TEST(BadInputGenerationParams, IdsOutsideTheVocabularyAndBadSizesAreUsageErrors) {
  auto usage_error = [](const GenerationParams& p) {
    try {
      validate(p, 100);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      return std::string(e.what());
    }
    return std::string();
  };
  GenerationParams p;
  p.suppress_tokens = {100};
  EXPECT_NE(usage_error(p).find("suppress-tokens: token id 100"), std::string::npos);
  p = {};
  p.bad_words_ids = {{}};
  EXPECT_NE(usage_error(p).find("bad-words-ids"), std::string::npos);
  p = {};
  p.forced_eos_token_ids = {-1};
  EXPECT_NE(usage_error(p).find("forced-eos-token-id"), std::string::npos);
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_NE(usage_error(p).find("repetition-penalty"), std::string::npos);
  p = {};
  p.no_repeat_ngram_size = -1;
  EXPECT_NE(usage_error(p).find("no-repeat-ngram-size"), std::string::npos);
}

}  // namespace
}  // namespace kiln
