// Files a HuggingFace checkpoint directory must hold beyond what each loader checks itself: a
// missing file is named, with what to do, before another file's unrelated error hides it.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "frontend/hf/frontend.h"

namespace kiln {

void check_tokenizer_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(fs::path(dir) / "spiece.model", ec)) return;
  std::ifstream in(fs::path(dir) / "config.json");
  if (!in) return;  // the config loader names a missing or unreadable config.json
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || config.value("model_type", nlohmann::json()) != "t5") return;
  // Without spiece.model the loader would fall back to tokenizer.json, whose T5 model (Unigram)
  // it does not read, and report that instead of the missing file.
  KILN_FAIL_KIND(ErrorKind::kNotFound,
                 "{}: no spiece.model. kiln tokenizes T5 with its SentencePiece model "
                 "spiece.model (not tokenizer.json's Unigram model); copy spiece.model from the "
                 "checkpoint this one came from into {}, e.g. for google/flan-t5-small: "
                 "huggingface-cli download google/flan-t5-small spiece.model --local-dir {}",
                 dir, dir, dir);
}

}  // namespace kiln
