#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "io/jsonl.h"
#include "plan/plan.h"

namespace kiln::cli {

Runner add_tokenize(CLI::App& app) {
  struct Opts {
    std::string model, plan, input;
    std::vector<std::string> texts;
    bool decode = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize text with a model's tokenizer (ids identical to HuggingFace), or decode ids.\n"
      "Examples:\n"
      "  kiln tokenize --model models/t5-tiny --text \"reverse: suvogi\"\n"
      "  kiln tokenize --model models/bloom-tiny --input prompts.jsonl --json\n"
      "  kiln tokenize --model models/t5-tiny --decode --text \"[302, 7, 1]\"");
  cmd->add_option("--model", o->model, "HuggingFace model directory");
  cmd->add_option("--plan", o->plan, "plan file (uses the tokenizer stored in it)");
  cmd->add_option("--text", o->texts,
                  "text to tokenize (repeatable); with --decode, a JSON id list");
  cmd->add_option("--input", o->input,
                  "JSON lines: a string or an object with \"text\" (with --decode: \"ids\")");
  cmd->add_flag("--decode", o->decode, "decode ids to text instead");
  cmd->add_flag("--json", o->json, "print {\"text\", \"ids\"} per line");
  return [o](const GlobalOptions& g) {
    KILN_CHECK_USAGE(o->model.empty() != o->plan.empty(), "give exactly one of --model or --plan");
    KILN_CHECK_USAGE(o->texts.empty() != o->input.empty(), "give --text or --input (one of them)");
    auto ctx = make_context(g);
    std::unique_ptr<Tokenizer> tok;
    if (!o->model.empty()) {
      tok = load_tokenizer_dir(o->model);
    } else {
      const ModelIR m = read_plan(o->plan, ctx->log());
      tok = make_model_tokenizer(m, o->plan);
    }
    std::vector<nlohmann::json> items;
    if (!o->input.empty()) {
      if (o->decode) {
        read_jsonl(o->input, [&](const nlohmann::json& j, int line) {
          const nlohmann::json ids = j.is_object() && j.contains("ids") ? j["ids"] : j;
          KILN_CHECK_USAGE(ids.is_array(), "{}:{}: expected an id list or {{\"ids\": [...]}}",
                           o->input, line);
          items.push_back(ids);
        });
      } else {
        for (const std::string& t : read_prompt_lines(o->input)) items.push_back(t);
      }
    } else if (o->decode) {
      // One id sequence from --text: "[1, 2, 3]" or "1 2 3" (CLI11 may already have split a
      // bracketed list into several values, so every value contributes its numbers).
      nlohmann::json ids = nlohmann::json::array();
      for (const std::string& t : o->texts) {
        std::string cleaned = t;
        for (char& ch : cleaned)
          if (ch == '[' || ch == ']' || ch == ',') ch = ' ';
        std::istringstream in(cleaned);
        std::string word;
        while (in >> word) {
          char* end = nullptr;
          const long long v = std::strtoll(word.c_str(), &end, 10);
          KILN_CHECK_USAGE(end != nullptr && *end == '\0',
                           "--decode --text expects token ids like \"[1, 2, 3]\", got '{}'", t);
          ids.push_back(static_cast<int64_t>(v));
        }
      }
      items.push_back(ids);
    } else {
      for (const std::string& t : o->texts) items.push_back(t);
    }
    for (const nlohmann::json& item : items) {
      std::string text;
      std::vector<int64_t> ids;
      if (o->decode) {
        KILN_CHECK_USAGE(item.is_array(), "expected a list of token ids, got {}", item.dump());
        for (const auto& v : item) {
          KILN_CHECK_USAGE(v.is_number_integer(), "token ids must be integers, got {}", v.dump());
          ids.push_back(v.get<int64_t>());
        }
        for (int64_t id : ids)
          KILN_CHECK_USAGE(id >= 0 && id < tok->vocab_size(), "token id {} is outside [0, {})", id,
                           tok->vocab_size());
        text = tok->decode(ids);
      } else {
        text = item.get<std::string>();
        ids = tok->encode(text);
      }
      if (o->json) {
        fmt::print("{}\n", nlohmann::json{{"text", text}, {"ids", ids}}.dump());
      } else if (o->decode) {
        fmt::print("{}\n", text);
      } else {
        fmt::print("{}\n", fmt::join(ids, " "));
      }
    }
    return 0;
  };
}

}  // namespace kiln::cli
