#include <map>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "output.h"

namespace kiln::cli {
namespace {

struct Row {
  std::string task, answer;
  TextInput prompt;
};

std::vector<Row> read_dataset(const std::string& path) {
  std::vector<Row> rows;
  const std::string name = input_name(path);
  read_jsonl_arg(path, "--dataset", [&](const nlohmann::json& j, int line) {
    auto field = [&](const char* key) {
      KILN_CHECK_USAGE(j.is_object() && j.contains(key) && j[key].is_string(),
                       "{}:{}: expected an object with \"task\", \"prompt\" and \"answer\" "
                       "strings ('{}' is missing or not a string)",
                       name, line, key);
      return j[key].get<std::string>();
    };
    rows.push_back(
        {field("task"), field("answer"), {field("prompt"), fmt::format("{}:{}", name, line)}});
  });
  KILN_CHECK_USAGE(!rows.empty(), "{}: the dataset has no rows (every line is blank)", name);
  return rows;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

Runner add_eval(CLI::App& app) {
  struct Opts {
    std::string plan, model, dataset;
    GenerationFlags gen;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Exact-match accuracy of generated answers (trimmed), per task and overall");
  describe(
      cmd,
      "Every row is checked before anything is generated: a bad row (not an object with\n"
      "\"task\", \"prompt\" and \"answer\" strings, an empty prompt, a prompt longer than the\n"
      "plan allows) stops eval with an error naming its file:line.\n"
      "Example:\n"
      "  kiln eval --plan t5.plan --dataset examples/dev.jsonl");
  cmd->add_option("--plan", o->plan, "plan file");
  cmd->add_option("--model", o->model, "HF directory, built in memory");
  cmd->add_option("--dataset", o->dataset,
                  "JSON lines {\"task\", \"prompt\", \"answer\"} (- reads standard input)")
      ->required();
  cmd->add_flag("--json", o->json, "print {\"overall\", \"per_task\", \"n\"}");
  o->gen.batch_size = 32;
  // Answers of the fixture tasks run past 16 tokens (copy: up to 25 characters); HF's reference
  // accuracies are measured with room to finish.
  o->gen.max_new_tokens = 64;
  add_generation_flags(*cmd, o->gen);
  return [o](const GlobalOptions& g) {
    KILN_CHECK_USAGE(o->plan.empty() != o->model.empty(), "give exactly one of --plan or --model");
    const std::vector<Row> rows = read_dataset(o->dataset);
    auto ctx = make_context(g);
    auto engine = open_engine(*ctx, o->plan, o->model);
    std::vector<TextInput> prompts;
    for (const Row& r : rows) prompts.push_back(r.prompt);
    std::map<std::string, std::pair<int, int>> per_task;  // correct, total
    int correct = 0, scored = 0;
    generate_all(*engine, prompts, o->gen, o->model, [&](size_t i, const Generated& r, Progress&) {
      const bool ok = trim(r.text) == trim(rows[i].answer);
      correct += ok;
      ++scored;
      auto& t = per_task[rows[i].task];
      t.first += ok;
      t.second += 1;
      return fmt::format("accuracy {:.3f}", static_cast<double>(correct) / scored);
    });
    const double overall = static_cast<double>(correct) / static_cast<double>(rows.size());
    if (o->json) {
      nlohmann::json pt = nlohmann::json::object();
      for (const auto& [task, c] : per_task)
        pt[task] = static_cast<double>(c.first) / static_cast<double>(c.second);
      out_line(nlohmann::json{{"overall", overall}, {"per_task", pt}, {"n", rows.size()}}.dump(
          -1, ' ', false, nlohmann::json::error_handler_t::replace));
    } else {
      out("{:<12} {:>8} {:>6}\n", "task", "accuracy", "n");
      for (const auto& [task, c] : per_task)
        out("{:<12} {:>8.3f} {:>6}\n", task,
            static_cast<double>(c.first) / static_cast<double>(c.second), c.second);
      out("{:<12} {:>8.3f} {:>6}\n", "overall", overall, rows.size());
    }
    return 0;
  };
}

}  // namespace kiln::cli
