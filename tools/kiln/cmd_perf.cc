// kiln perf: load-tests a running server (kiln serve, Triton, vLLM, ...) the way Triton's
// perf_analyzer and genai-perf do: C clients sending generation requests back to back, for each
// concurrency C asked for, reporting throughput and TTFT / inter-token / end-to-end latency.
#include <atomic>
#include <cctype>
#include <fstream>
#include <limits>
#include <thread>

#include "commands.h"
#include "core/logging.h"
#include "output.h"
#include "perf_client.h"
#include "perf_stats.h"

namespace kiln::cli {
namespace {

using perf::Clock;

// Common English words: most tokenizers (BPE and SentencePiece alike) make one token of each,
// with its leading space, so N words is about N tokens.
constexpr const char* kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "that",  "for",   "it",     "as",
    "was",   "with",  "be",    "by",    "on",    "not",   "he",    "this",  "are",    "or",
    "his",   "from",  "at",    "which", "but",   "have",  "an",    "had",   "they",   "you",
    "were",  "their", "one",   "all",   "we",    "can",   "her",   "has",   "there",  "been",
    "if",    "more",  "when",  "will",  "would", "who",   "so",    "no",    "time",   "people",
    "year",  "way",   "day",   "man",   "thing", "world", "life",  "hand",  "part",   "child",
    "eye",   "woman", "place", "work",  "week",  "case",  "point", "water", "room",   "house",
    "story", "fact",  "month", "book",  "word",  "home",  "city",  "name",  "team",   "door",
    "small", "large", "good",  "new",   "first", "last",  "long",  "great", "little", "own",
    "other", "old",   "right", "big",   "high",  "early", "young", "open",  "short",  "light"};

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Prompt k of the run: line k (cycled) of --prompts, or `words` random common words drawn from
// (seed, k), so no two requests send the same prompt (a server's prefix cache would otherwise
// make every prompt after the first free) and the same seed sends the same prompts.
struct Prompts {
  std::vector<std::string> lines;
  int64_t words = 0;
  uint64_t seed = 0;

  std::string get(uint64_t k) const {
    if (!lines.empty()) return lines[k % lines.size()];
    uint64_t state = seed * 0x632BE59BD9B4E019ull + k;
    std::string text;
    for (int64_t i = 0; i < words; ++i) {
      if (i > 0) text += ' ';
      text += kWords[splitmix64(state) % std::size(kWords)];
    }
    return text;
  }
};

std::vector<int> parse_concurrency(const std::string& list) {
  std::vector<int> levels;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    char* end = nullptr;
    const long c = std::strtol(item.c_str(), &end, 10);
    KILN_CHECK_USAGE(!item.empty() && *end == '\0' && c >= 1 && c <= 1024,
                     "--concurrency {}: '{}' is not an integer in 1..1024 (give a list like "
                     "1,8,32)",
                     list, item);
    levels.push_back(static_cast<int>(c));
    pos = comma + 1;
  }
  return levels;
}

std::string read_api_key(const std::string& path) {
  std::ifstream in(path);
  if (!in) KILN_FAIL_KIND(ErrorKind::kNotFound, "--api-key-file {}: cannot open the file", path);
  std::string key;
  std::getline(in, key);
  while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
  KILN_CHECK_USAGE(!key.empty(), "--api-key-file {}: the first line is empty", path);
  return key;
}

// One concurrency level: `c` threads, each with its own kept-alive connection, send requests
// back to back from now until `window_end`; what is still running then is abandoned.
std::vector<perf::RequestResult> run_level(const perf::Target& target, const Prompts& prompts,
                                           std::atomic<uint64_t>& next_prompt, int c,
                                           Clock::time_point window_end) {
  std::vector<std::vector<perf::RequestResult>> per_thread(c);
  std::vector<std::thread> threads;
  for (int i = 0; i < c; ++i)
    threads.emplace_back([&, i] {
      std::vector<perf::RequestResult>& out = per_thread[i];
      try {
        perf::Connection connection(target);
        while (Clock::now() < window_end) {
          out.push_back(
              perf::run_request(connection, target, prompts.get(next_prompt++), window_end));
          // A server that went away fails every request at once: pause so the loop does not
          // spin on it (the errors are still counted).
          if (!out.back().error.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      } catch (const std::exception& e) {
        perf::RequestResult r;
        r.sent = r.done = Clock::now();
        r.error = e.what();
        out.push_back(r);
      }
    });
  for (std::thread& t : threads) t.join();
  std::vector<perf::RequestResult> all;
  for (auto& v : per_thread) all.insert(all.end(), v.begin(), v.end());
  return all;
}

}  // namespace

Runner add_perf(CLI::App& app) {
  struct Opts {
    std::string url, model, prompts_file, concurrency = "1", protocol = "openai", api_key_file;
    int64_t prompt_len = 0, output_len = 128, seed = 0;
    double duration = 10, warmup = 2, temperature = 0, timeout = 600;
    bool stream = false, json = false, ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "perf",
      "Load-test a running server: throughput, TTFT and inter-token latency per concurrency");
  describe(
      cmd,
      "For each concurrency C of --concurrency, C clients (threads, each with its own kept-alive\n"
      "connection) send generation requests back to back: --warmup seconds first, then a\n"
      "--duration window measured. As in perf_analyzer, the requests that end inside the window\n"
      "count, whenever they began (the load is at C throughout it); those still running when it\n"
      "closes are abandoned (connection closed) and not counted. Rates are per second of the\n"
      "window. Reported per concurrency: requests/s, output tokens/s, time to first token (TTFT:\n"
      "sending to the first event with output), inter-token latency (per request, as genai-perf:\n"
      "(last token time - first token time) / (tokens - 1), requests of 2+ tokens), end-to-end\n"
      "latency, tokens a request, completed requests, errors (count and the first message).\n"
      "TTFT and inter-token latency need --stream. Percentiles are nearest-rank: p99 is the\n"
      "smallest value with at least 99 % of the requests at or below it (always a measured one).\n"
      "Tokens are the server's counts (OpenAI usage.completion_tokens, asked for with\n"
      "stream_options.include_usage; KServe token_ids, asked for with return_token_ids), else\n"
      "stream events, else (unstreamed) --output-len; the output says when.\n"
      "Protocols: openai = POST /v1/completions; kserve = Triton's generate extension, POST\n"
      "/v2/models/M/generate (or generate_stream with --stream); grpc = KServe v2 gRPC\n"
      "(inference.GRPCInferenceService): ModelInfer, or ModelStreamInfer with --stream, a BYTES\n"
      "text_input of shape [1], the text from text_output, tokens from a token_ids output\n"
      "(--url HOST:PORT, e.g. localhost:8001; --timeout bounds the whole call).\n"
      "Requests are greedy (temperature 0) unless --temperature is given.\n"
      "The first request is sent alone before any level: if it fails (server unreachable, wrong\n"
      "model) kiln perf stops with exit 1 and its error.\n"
      // Not "Examples:": tests/cli/examples.sh runs those, and these need a server.
      "Examples (with a server running: HTTP at localhost:8000, gRPC at localhost:8001):\n"
      "  kiln perf --url http://localhost:8000 --model bloom --prompt-len 128 --stream "
      "--concurrency 1,8,32\n"
      "  kiln perf --url http://localhost:8000 --model t5 --protocol kserve --prompts p.jsonl "
      "--json\n"
      "  kiln perf --url localhost:8001 --model t5 --protocol grpc --prompt-len 64 --stream");
  cmd->add_option("--url", o->url, "the server: http://HOST:PORT (a path after it is a prefix)")
      ->required();
  cmd->add_option("--model", o->model, "the model name the server knows")->required();
  CLI::Option* len_opt =
      in_range(cmd->add_option("--prompt-len", o->prompt_len,
                               "synthetic prompts of about N tokens (N random common words: "
                               "words ~ tokens, approximate; each request's differ)"),
               1, 1 << 20);
  CLI::Option* file_opt =
      one_value(cmd->add_option("--prompts", o->prompts_file,
                                "JSON lines file of prompts: strings, or objects with \"text\" or "
                                "\"prompt\"; cycled (- reads standard input)"));
  len_opt->excludes(file_opt);
  in_range(cmd->add_option("--output-len", o->output_len, "output tokens each request asks for"), 1,
           1 << 20)
      ->capture_default_str();
  one_value(cmd->add_option("--concurrency", o->concurrency,
                            "concurrent clients, or a list of levels run in turn: 1,8,32 "
                            "(each 1..1024)"))
      ->capture_default_str();
  cmd->add_option("--duration", o->duration, "seconds measured at each concurrency")
      ->check(number_check([](double v) { return v > 0 && v <= 86400; }, "in (0, 86400]"))
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "seconds of requests before each window, not counted")
      ->check(number_check([](double v) { return v >= 0 && v <= 3600; }, "in 0..3600"))
      ->capture_default_str();
  cmd->add_option("--protocol", o->protocol, "openai, kserve or grpc")
      ->check(CLI::IsMember({"openai", "kserve", "grpc"}))
      ->capture_default_str();
  cmd->add_flag("--stream", o->stream,
                "stream the output (Server-Sent Events): needed for TTFT and inter-token latency");
  cmd->add_flag("--json", o->json,
                "one JSON object (results: one per concurrency) instead of a table");
  cmd->add_option("--api-key-file", o->api_key_file,
                  "send 'Authorization: Bearer KEY', KEY the file's first line");
  in_range(
      cmd->add_option("--seed", o->seed, "the synthetic prompts' words (same seed, same prompts)"),
      0, std::numeric_limits<int64_t>::max())
      ->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "sampling temperature sent (0: greedy)")
      ->check(number_check([](double v) { return v >= 0 && v <= 100; }, "in 0..100"))
      ->capture_default_str();
  cmd->add_flag(
      "--ignore-eos", o->ignore_eos,
      "ask the server to ignore EOS (\"ignore_eos\": true; vLLM and kiln take it) so that "
      "every request makes --output-len tokens");
  cmd->add_option("--timeout", o->timeout,
                  "seconds a request may wait for data before it fails (gRPC: the whole call)")
      ->check(number_check([](double v) { return v > 0 && v <= 86400; }, "in (0, 86400]"))
      ->capture_default_str();

  return [o, len_opt, file_opt](const GlobalOptions& g) {
    KILN_CHECK_USAGE(len_opt->count() + file_opt->count() == 1,
                     "give --prompt-len N (synthetic prompts) or --prompts FILE.jsonl");
    KILN_CHECK_USAGE(!o->model.empty(), "--model: the name is empty");
    const std::vector<int> levels = parse_concurrency(o->concurrency);
    perf::Target target;
    perf::parse_url(o->url, target);
    target.model = o->model;
    target.protocol = o->protocol == "kserve" ? perf::Protocol::kKserve
                      : o->protocol == "grpc" ? perf::Protocol::kGrpc
                                              : perf::Protocol::kOpenAi;
    target.stream = o->stream;
    target.output_len = o->output_len;
    target.temperature = o->temperature;
    target.ignore_eos = o->ignore_eos;
    target.timeout_s = o->timeout;
    if (!o->api_key_file.empty()) target.api_key = read_api_key(o->api_key_file);
    Prompts prompts;
    prompts.words = o->prompt_len;
    prompts.seed = static_cast<uint64_t>(o->seed);
    if (file_opt->count() > 0) {
      for (const TextInput& in : read_prompt_lines(o->prompts_file, "--prompts")) {
        check_text(in, false);
        prompts.lines.push_back(in.text);
      }
      KILN_CHECK_USAGE(!prompts.lines.empty(), "--prompts {}: no prompts in the file",
                       input_name(o->prompts_file));
    }
    Logger log(g.verbose ? LogLevel::kInfo : g.quiet ? LogLevel::kError : LogLevel::kWarning);

    perf::RunDescription run;
    run.url = o->url;
    run.model = o->model;
    run.protocol = o->protocol;
    run.stream = o->stream;
    run.prompts = prompts.lines.empty()
                      ? fmt::format("about {} words", o->prompt_len)
                      : fmt::format("{} ({} prompt{})", input_name(o->prompts_file),
                                    prompts.lines.size(), prompts.lines.size() == 1 ? "" : "s");
    run.output_len = o->output_len;
    run.duration_s = o->duration;
    run.warmup_s = o->warmup;

    // One request alone first: a server that is not there, or does not know the model, is
    // reported now rather than as --duration seconds of errors per level.
    std::atomic<uint64_t> next_prompt{0};
    {
      perf::Connection connection(target);
      const perf::RequestResult first =
          perf::run_request(connection, target, prompts.get(next_prompt++));
      if (first.unreachable) KILN_FAIL("cannot reach {}: {}", o->url, first.error);
      if (!first.error.empty())
        KILN_FAIL("the first request (POST {}{}) failed: {}", target.scheme_host_port,
                  perf::request_path(target), first.error);
      log.info("first request: {} output tokens in {:.1f} ms", first.output_tokens,
               std::chrono::duration<double, std::milli>(first.done - first.sent).count());
      if (!first.tokens_counted_by_server)
        log.warn("the server reported no token counts ({}): output tokens are {}",
                 target.protocol == perf::Protocol::kOpenAi ? "no usage.completion_tokens"
                                                            : "no token_ids",
                 o->stream ? "counted as stream events" : "taken to be --output-len");
    }

    if (!o->json) out_text(perf::format_header(run));
    std::vector<perf::LevelResult> results;
    for (const int c : levels) {
      const auto warmup =
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o->warmup));
      const auto duration =
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o->duration));
      const Clock::time_point window_start = Clock::now() + warmup;
      const Clock::time_point window_end = window_start + duration;
      std::vector<perf::RequestResult> requests;
      {
        Activity activity(
            log, fmt::format("concurrency {}: {:g} s warmup + {:g} s", c, o->warmup, o->duration));
        requests = run_level(target, prompts, next_prompt, c, window_end);
      }
      results.push_back(perf::aggregate(c, requests, window_start, window_end));
      const perf::LevelResult& r = results.back();
      log.info("concurrency {}: {} requests sent, {} counted", c, requests.size(),
               r.completed + r.errors);
      if (r.errors > 0)
        log.warn("concurrency {}: {} of {} requests failed (first: {})", c, r.errors,
                 r.errors + r.completed, r.first_error);
      else if (r.completed == 0)
        log.warn(
            "concurrency {}: no request ended inside the {:g} s window: give a longer "
            "--duration",
            c, o->duration);
      if (!o->json) out_text(perf::format_level(run, r));
    }
    if (o->json) out_line(perf::to_json(run, results).dump());
    return 0;
  };
}

}  // namespace kiln::cli
