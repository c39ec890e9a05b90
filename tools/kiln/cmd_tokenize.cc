#include <cerrno>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "frontend/hf/frontend.h"
#include "output.h"
#include "plan/plan.h"

namespace kiln::cli {
namespace {

struct IdsInput {
  std::vector<int64_t> ids;
  std::string origin;
};

std::vector<int64_t> ids_from_json(const nlohmann::json& list, const std::string& origin) {
  KILN_CHECK_USAGE(list.is_array(), "{}: expected a list of token ids like [6, 17, 1], got {}",
                   origin, list.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  std::vector<int64_t> ids;
  for (const auto& v : list) {
    KILN_CHECK_USAGE(v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0),
                     "{}: token ids are integers >= 0, got {}", origin, v.dump());
    KILN_CHECK_USAGE(
        !v.is_number_unsigned() ||
            v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
        "{}: token id {} is out of range", origin, v.dump());
    ids.push_back(v.get<int64_t>());
  }
  return ids;
}

// One --text value with --decode: a JSON list "[6, 17, 1]", or ids separated by spaces.
std::vector<int64_t> ids_from_text(const std::string& text, const std::string& origin) {
  const size_t first = text.find_first_not_of(" \t");
  if (first != std::string::npos && text[first] == '[') {
    nlohmann::json list;
    try {
      list = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      KILN_FAIL_KIND(ErrorKind::kUsage, "{}: expected token ids like \"[6, 17, 1]\", got '{}'",
                     origin, text);
    }
    return ids_from_json(list, origin);
  }
  std::vector<int64_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(word.c_str(), &end, 10);
    KILN_CHECK_USAGE(*end == '\0' && end != word.c_str() && errno == 0 && v >= 0,
                     "{}: expected token ids (integers >= 0) like \"6 17 1\" or \"[6, 17, 1]\", "
                     "got '{}'",
                     origin, word);
    ids.push_back(static_cast<int64_t>(v));
  }
  return ids;
}

}  // namespace

Runner add_tokenize(CLI::App& app) {
  struct Opts {
    std::string model, plan, input;
    std::vector<std::string> texts;
    bool decode = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize text with a model's tokenizer (ids identical to HuggingFace's), or decode ids");
  describe(
      cmd,
      "With --decode, ids the tokenizer has no token for (a model's vocabulary may be padded\n"
      "beyond its tokenizer's) are left out of the text with a warning, as HF's decode does.\n"
      "Examples:\n"
      "  kiln tokenize --model models/t5-tiny --text \"reverse: suvogi\"\n"
      "  kiln tokenize --model models/bloom-tiny --input prompts.jsonl --json\n"
      "  kiln tokenize --model models/t5-tiny --decode --text \"[159, 154, 55, 41, 156, 99]\"");
  cmd->add_option("--model", o->model, "HuggingFace model directory");
  cmd->add_option("--plan", o->plan, "plan file (uses the tokenizer stored in it)");
  one_value(cmd->add_option("--text", o->texts,
                            "one text, exactly as given (repeatable: one output line each); with "
                            "--decode, one id list \"[6, 17, 1]\" or \"6 17 1\""));
  cmd->add_option("--input", o->input,
                  "JSON lines: a string or an object with \"text\" (with --decode: an id list or "
                  "{\"ids\": [...]}); - reads standard input");
  cmd->add_flag("--decode", o->decode, "decode ids to text instead");
  cmd->add_flag("--json", o->json, "print {\"text\", \"ids\"} per line");
  return [o](const GlobalOptions& g) {
    KILN_CHECK_USAGE(o->model.empty() != o->plan.empty(), "give exactly one of --model or --plan");
    KILN_CHECK_USAGE(o->texts.empty() || o->input.empty(), "give --text or --input, not both");
    KILN_CHECK_USAGE(!o->texts.empty() || !o->input.empty(),
                     "give --text TEXT (repeatable) or --input FILE.jsonl");
    // Every input is read and checked before anything is printed.
    std::vector<TextInput> texts;
    std::vector<IdsInput> id_lists;
    if (o->decode && !o->input.empty()) {
      const std::string name = input_name(o->input);
      read_jsonl_arg(o->input, "--input", [&](const nlohmann::json& j, int line) {
        const std::string origin = fmt::format("{}:{}", name, line);
        const nlohmann::json& ids = j.is_object() && j.contains("ids") ? j["ids"] : j;
        KILN_CHECK_USAGE(ids.is_array(), "{}: expected an id list or {{\"ids\": [...]}}", origin);
        id_lists.push_back({ids_from_json(ids, origin), origin});
      });
    } else if (o->decode) {
      for (const TextInput& t : inputs_from_flag(o->texts, "--text"))
        id_lists.push_back({ids_from_text(t.text, t.origin), t.origin});
    } else {
      texts = o->input.empty() ? inputs_from_flag(o->texts, "--text")
                               : read_prompt_lines(o->input, "--input");
      for (const TextInput& t : texts) check_text(t, /*allow_empty=*/true);
    }
    auto ctx = make_context(g);
    std::unique_ptr<Tokenizer> tok;
    if (!o->model.empty()) {
      check_model_dir(o->model, "--model");
      check_tokenizer_files(o->model);
      tok = load_tokenizer_dir(o->model);
    } else {
      check_plan_file(o->plan, "--plan");
      const ModelIR m = read_plan(o->plan, ctx->log());
      tok = make_model_tokenizer(m, o->plan);
    }
    auto print = [&](const std::string& text, const std::vector<int64_t>& ids) {
      if (o->json)
        out_line(nlohmann::json{{"text", text}, {"ids", ids}}.dump(
            -1, ' ', false, nlohmann::json::error_handler_t::replace));
      else if (o->decode)
        out_line(text);
      else
        out_line(fmt::format("{}", fmt::join(ids, " ")));
    };
    for (const IdsInput& in : id_lists)
      print(decode_ids(*tok, in.ids, in.origin, ctx->log()), in.ids);
    for (const TextInput& t : texts) print(t.text, tok->encode(t.text));
    return 0;
  };
}

}  // namespace kiln::cli
