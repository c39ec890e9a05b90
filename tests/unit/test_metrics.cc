// The metrics page (Prometheus text format 0.0.4 with Triton's names), the NVML loader's absent
// path and GPU rendering, the request log, and the metrics port against a real model.
#include <gtest/gtest.h>
#include <cctype>

#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/errors.h"
#include "server/exposition.h"
#include "server/generation_service.h"
#include "server/gpu_metrics.h"
#include "server/metrics.h"
#include "server/metrics_http.h"
#include "server/model_manager.h"
#include "server/request_log.h"

namespace kiln::server {
namespace {

namespace fs = std::filesystem;

// --- a small parser of the text format, independent of the writer --------------------------

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  std::string value;
};

struct Page {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;  // family -> type
  std::vector<std::string> family_order;     // families in the order their headers came
};

// Parses the page; fails the test on a line that is not valid 0.0.4 text.
Page parse_page(const std::string& text) {
  Page page;
  std::string current;  // the family whose lines are being read
  std::set<std::string> closed;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    EXPECT_NE(end, std::string::npos) << "the page must end with a newline";
    if (end == std::string::npos) break;
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# HELP ", 0) == 0) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_EQ(closed.count(name), 0u) << "family " << name << " appears twice";
      if (!current.empty() && current != name) closed.insert(current);
      current = name;
      page.family_order.push_back(name);
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      const size_t sp = line.find(' ', 7);
      const std::string name = line.substr(7, sp - 7);
      EXPECT_EQ(name, current) << "TYPE must follow its family's HELP";
      page.types[name] = line.substr(sp + 1);
      continue;
    }
    EXPECT_NE(line[0], '#') << line;
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') s.name += line[i++];
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (line[i] != '}') {
        std::string key;
        while (line[i] != '=') key += line[i++];
        EXPECT_EQ(line[i + 1], '"') << line;
        i += 2;
        std::string value;
        while (line[i] != '"') {
          if (line[i] == '\\') {
            const char c = line[++i];
            EXPECT_TRUE(c == '\\' || c == '"' || c == 'n') << "bad escape in " << line;
            value += c == 'n' ? '\n' : c;
          } else {
            EXPECT_NE(line[i], '\n');
            value += line[i];
          }
          ++i;
        }
        ++i;  // closing quote
        s.labels[key] = value;
        if (line[i] == ',') ++i;
      }
      ++i;
    }
    EXPECT_EQ(line[i], ' ') << line;
    s.value = line.substr(i + 1);
    // The sample belongs to the current family (name, or name_bucket/_sum/_count).
    EXPECT_EQ(s.name.rfind(current, 0), 0u) << s.name << " outside its family " << current;
    page.samples.push_back(std::move(s));
  }
  return page;
}

const Sample* find(const Page& page, const std::string& name,
                   const std::map<std::string, std::string>& labels) {
  for (const Sample& s : page.samples) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) all = false;
    }
    if (all) return &s;
  }
  return nullptr;
}

std::string value_of(const Page& page, const std::string& name,
                     const std::map<std::string, std::string>& labels) {
  const Sample* s = find(page, name, labels);
  return s != nullptr ? s->value : "(absent)";
}

ModelMetrics made_up_model(const std::string& name, int64_t version) {
  ModelMetrics m;
  m.name = name;
  m.version = version;
  m.instances = 2;
  m.refused = 1;
  ExecutorStats& s = m.stats;
  s.success = 7;
  s.cancelled = 2;
  s.rejected = 3;
  s.queue_timeouts = 4;
  s.timeouts = 5;
  s.errors = 6;
  s.steps = 40;
  s.pending = 5;
  s.running = 3;
  s.request_us = 123456;
  s.queue_us = 2345;
  s.compute_us = 121111;
  s.input_tokens = 70;
  s.output_tokens = 90;
  s.kv_blocks_used = 12;
  s.kv_bytes_allocated = 1 << 20;
  s.preemptions = 1;
  s.steps_ahead = 7;
  s.encoder_steps = 5;
  s.decoder_launches = {30, 4, 6, 0.25};  // replayed, captured, eager, capture ms
  s.encoder_launches = {0, 0, 5, 0};
  s.busy_us = 1500000;
  s.ttft_seconds = Histogram({0.01, 0.1, 1});
  for (double v : {0.005, 0.05, 0.06, 0.5, 3.0}) s.ttft_seconds.observe(v);
  s.inter_token_seconds = Histogram({0.01});
  s.output_tokens_per_request = Histogram({1, 16});
  s.output_tokens_per_request.observe(16);  // on the bound: counted in le="16"
  s.batch_size = Histogram({1, 2, 4});
  for (double v : {1, 2, 2, 4}) s.batch_size.observe(v);
  return m;
}

TEST(MetricsExposition, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(escape_label_value("plain-name_1.0"), "plain-name_1.0");
  EXPECT_EQ(escape_help("x \"quoted\" \\ y\nz"), "x \"quoted\" \\\\ y\\nz");
  EXPECT_EQ(format_value(3.0), "3");
  EXPECT_EQ(format_value(0.0025), "0.0025");
  EXPECT_EQ(format_value(1.0 / 0.0), "+Inf");
  EXPECT_EQ(format_value(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(format_value(std::nan("")), "NaN");
}

TEST(MetricsExposition, ModelPageHasTritonsNamesLabelsAndTypes) {
  const Page page = parse_page(render_model_metrics({made_up_model("bloom", 1)}));
  const std::map<std::string, std::string> l = {{"model", "bloom"}, {"version", "1"}};
  EXPECT_EQ(value_of(page, "nv_inference_request_success", l), "7");
  EXPECT_EQ(value_of(page, "nv_inference_count", l), "7");
  EXPECT_EQ(value_of(page, "nv_inference_exec_count", l), "40");
  EXPECT_EQ(value_of(page, "nv_inference_request_duration_us", l), "123456");
  EXPECT_EQ(value_of(page, "nv_inference_queue_duration_us", l), "2345");
  EXPECT_EQ(value_of(page, "nv_inference_compute_infer_duration_us", l), "121111");
  EXPECT_EQ(value_of(page, "nv_inference_pending_request_count", l), "2") << "5 enqueued, 3 run";
  // Triton's reasons: queue full and queue timeout are REJECTED; the run deadline and requests
  // refused before an executor are OTHER.
  auto failure = [&](const char* reason) {
    auto labels = l;
    labels["reason"] = reason;
    return value_of(page, "nv_inference_request_failure", labels);
  };
  EXPECT_EQ(failure("REJECTED"), "7");
  EXPECT_EQ(failure("CANCELED"), "2");
  EXPECT_EQ(failure("BACKEND"), "6");
  EXPECT_EQ(failure("OTHER"), "6");
  EXPECT_EQ(value_of(page, "kiln_running_sequences", l), "3");
  EXPECT_EQ(value_of(page, "kiln_kv_blocks_used", l), "12");
  EXPECT_EQ(find(page, "kiln_kv_blocks_free", l), nullptr) << "no budget: no free count";
  EXPECT_EQ(value_of(page, "kiln_kv_cache_bytes", l), "1048576");
  EXPECT_EQ(value_of(page, "kiln_preemptions_total", l), "1");
  EXPECT_EQ(value_of(page, "kiln_steps_run_ahead_total", l), "7");
  EXPECT_EQ(value_of(page, "kiln_encoder_steps_total", l), "5");
  auto launches = [&](const char* graph, const char* launch) {
    auto labels = l;
    labels["graph"] = graph;
    labels["launch"] = launch;
    return value_of(page, "kiln_step_launches_total", labels);
  };
  EXPECT_EQ(launches("decoder", "replayed"), "30");
  EXPECT_EQ(launches("decoder", "captured"), "4");
  EXPECT_EQ(launches("decoder", "eager"), "6");
  EXPECT_EQ(launches("encoder", "eager"), "5");
  auto decoder = l;
  decoder["graph"] = "decoder";
  EXPECT_EQ(value_of(page, "kiln_step_capture_seconds_total", decoder), "0.00025");
  EXPECT_EQ(value_of(page, "kiln_input_tokens_total", l), "70");
  EXPECT_EQ(value_of(page, "kiln_output_tokens_total", l), "90");
  EXPECT_EQ(value_of(page, "kiln_engine_busy_seconds_total", l), "1.5");
  EXPECT_EQ(value_of(page, "kiln_model_instances", l), "2");

  EXPECT_EQ(page.types.at("nv_inference_request_success"), "counter");
  EXPECT_EQ(page.types.at("nv_inference_request_failure"), "counter");
  EXPECT_EQ(page.types.at("nv_inference_pending_request_count"), "gauge");
  EXPECT_EQ(page.types.at("kiln_time_to_first_token_seconds"), "histogram");
  EXPECT_EQ(page.types.at("kiln_kv_blocks_used"), "gauge");
  for (const Sample& s : page.samples) {
    EXPECT_EQ(s.labels.at("model"), "bloom") << s.name;
    EXPECT_EQ(s.labels.at("version"), "1") << s.name;
  }
}

TEST(MetricsExposition, HistogramBucketsAreCumulativeAndInfEqualsCount) {
  const Page page = parse_page(render_model_metrics({made_up_model("bloom", 1)}));
  const std::map<std::string, std::string> l = {{"model", "bloom"}, {"version", "1"}};
  auto bucket = [&](const char* name, const char* le) {
    auto labels = l;
    labels["le"] = le;
    return value_of(page, std::string(name) + "_bucket", labels);
  };
  // Observations 0.005, 0.05, 0.06, 0.5, 3.0 against bounds 0.01, 0.1, 1.
  EXPECT_EQ(bucket("kiln_time_to_first_token_seconds", "0.01"), "1");
  EXPECT_EQ(bucket("kiln_time_to_first_token_seconds", "0.1"), "3");
  EXPECT_EQ(bucket("kiln_time_to_first_token_seconds", "1"), "4");
  EXPECT_EQ(bucket("kiln_time_to_first_token_seconds", "+Inf"), "5");
  EXPECT_EQ(value_of(page, "kiln_time_to_first_token_seconds_count", l), "5");
  EXPECT_NEAR(std::stod(value_of(page, "kiln_time_to_first_token_seconds_sum", l)), 3.615, 1e-12);
  EXPECT_EQ(bucket("kiln_generated_tokens_per_request", "1"), "0");
  EXPECT_EQ(bucket("kiln_generated_tokens_per_request", "16"), "1") << "le is inclusive";
  EXPECT_EQ(bucket("kiln_batch_size", "2"), "3");
  EXPECT_EQ(bucket("kiln_inter_token_latency_seconds", "+Inf"), "0") << "no observation yet";
  // Every histogram: buckets never decrease and +Inf equals _count.
  for (const char* h : {"kiln_time_to_first_token_seconds", "kiln_inter_token_latency_seconds",
                        "kiln_generated_tokens_per_request", "kiln_batch_size"}) {
    int64_t last = 0;
    std::string inf;
    for (const Sample& s : page.samples) {
      if (s.name != std::string(h) + "_bucket") continue;
      const int64_t v = std::stoll(s.value);
      EXPECT_GE(v, last) << h << " le=" << s.labels.at("le");
      last = v;
      if (s.labels.at("le") == "+Inf") inf = s.value;
    }
    EXPECT_EQ(inf, value_of(page, std::string(h) + "_count", l)) << h;
  }
}

TEST(MetricsExposition, LabelValuesWithQuotesBackslashesAndNewlinesRoundTrip) {
  const std::string odd = "we\"ird\\na\nme";
  const std::string page_text = render_model_metrics({made_up_model(odd, 3)});
  EXPECT_NE(page_text.find("model=\"we\\\"ird\\\\na\\nme\""), std::string::npos);
  const Page page = parse_page(page_text);
  EXPECT_EQ(value_of(page, "nv_inference_request_success", {{"model", odd}}), "7");
}

TEST(MetricsExposition, EachFamilyOnceWithEveryModelTogether) {
  ModelMetrics budget = made_up_model("t5", 2);
  budget.stats.kv_blocks_budget = 100;
  const Page page = parse_page(render_model_metrics({made_up_model("bloom", 1), budget}));
  // parse_page fails on a family that appears twice; both models are in each family.
  EXPECT_EQ(value_of(page, "nv_inference_exec_count", {{"model", "t5"}, {"version", "2"}}), "40");
  EXPECT_EQ(value_of(page, "kiln_kv_blocks_free", {{"model", "t5"}}), "88");
  EXPECT_EQ(find(page, "kiln_kv_blocks_free", {{"model", "bloom"}}), nullptr);
  const std::set<std::string> unique(page.family_order.begin(), page.family_order.end());
  EXPECT_EQ(unique.size(), page.family_order.size());
}

TEST(MetricsExposition, NoModelsStillDescribesEveryFamily) {
  const Page page = parse_page(render_model_metrics({}));
  EXPECT_TRUE(page.samples.empty());
  EXPECT_EQ(page.types.count("nv_inference_request_success"), 1u);
  EXPECT_EQ(page.types.count("kiln_batch_size"), 1u);
}

// --- GPU ---------------------------------------------------------------------------------------

TEST(GpuMetrics, AbsentLibraryGivesNoCollectorAndSaysWhy) {
  std::string why;
  EXPECT_EQ(GpuMetrics::open_library("libkiln-no-such-nvml.so.1", &why), nullptr);
  EXPECT_NE(why.find("libkiln-no-such-nvml.so.1"), std::string::npos) << why;
  EXPECT_NE(why.find("no GPU metrics"), std::string::npos) << why;
}

TEST(GpuMetrics, ALibraryThatIsNotNvmlIsRefusedNamingTheMissingFunction) {
  std::string why;
  EXPECT_EQ(GpuMetrics::open_library("libm.so.6", &why), nullptr);
  EXPECT_NE(why.find("nvmlInit_v2"), std::string::npos) << why;
}

TEST(GpuMetrics, ThisMachineEitherHasGpusOrSaysWhyNot) {
  std::string why;
  auto gpu = GpuMetrics::open(&why);
  if (gpu == nullptr) {
    EXPECT_FALSE(why.empty());
    GTEST_SKIP() << "no NVML here: " << why;
  }
  const Page page = parse_page(gpu->render());
  ASSERT_FALSE(page.samples.empty());
  for (const Sample& s : page.samples) EXPECT_EQ(s.labels.at("gpu_uuid").rfind("GPU-", 0), 0u);
  const Sample* total = find(page, "nv_gpu_memory_total_bytes", {});
  ASSERT_NE(total, nullptr);
  EXPECT_GT(std::stod(total->value), 0.0);
}

TEST(GpuMetrics, RendersReadingsWithTritonsNamesAndLeavesOutMissingValues) {
  GpuReading a;
  a.uuid = "GPU-1111";
  a.name = "NVIDIA H200";
  a.utilization = 0.37;
  a.memory_total_bytes = 150754820096ULL;
  a.memory_used_bytes = 1048576;
  a.power_watts = 123.456;
  a.sm_clock_mhz = 1980;
  GpuReading b;  // a device that reports only memory
  b.uuid = "GPU-2222";
  b.memory_total_bytes = 1000;
  b.memory_used_bytes = 10;
  const Page page = parse_page(render_gpu_metrics({a, b}));
  EXPECT_EQ(value_of(page, "nv_gpu_utilization", {{"gpu_uuid", "GPU-1111"}}), "0.37");
  EXPECT_EQ(value_of(page, "nv_gpu_memory_total_bytes", {{"gpu_uuid", "GPU-1111"}}),
            "150754820096");
  EXPECT_EQ(value_of(page, "nv_gpu_memory_used_bytes", {{"gpu_uuid", "GPU-1111"}}), "1048576");
  EXPECT_EQ(value_of(page, "nv_gpu_power_usage", {{"gpu_uuid", "GPU-1111"}}), "123.456");
  EXPECT_EQ(value_of(page, "kiln_gpu_sm_clock_mhz", {{"gpu_uuid", "GPU-1111"}}), "1980");
  EXPECT_EQ(value_of(page, "nv_gpu_memory_total_bytes", {{"gpu_uuid", "GPU-2222"}}), "1000");
  EXPECT_EQ(find(page, "nv_gpu_utilization", {{"gpu_uuid", "GPU-2222"}}), nullptr);
  EXPECT_EQ(find(page, "nv_gpu_power_usage", {{"gpu_uuid", "GPU-2222"}}), nullptr);
  for (const auto& [name, type] : page.types) EXPECT_EQ(type, "gauge") << name;
}

// --- request log -------------------------------------------------------------------------------

std::string temp_path(const std::string& name) {
  const fs::path dir = fs::path(KILN_TEST_TMP) / "metrics";
  fs::create_directories(dir);
  const fs::path p = dir / name;
  fs::remove(p);
  return p.string();
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

RequestRecord record(EndCause cause, FinishReason reason, bool token, std::string error = "") {
  RequestRecord r;
  r.id = 1;
  r.input_tokens = 5;
  r.output_tokens = token ? 12 : 0;
  r.queued = Clock::now() - std::chrono::microseconds(20500);
  r.first_token = token ? r.queued + std::chrono::microseconds(3100) : Clock::time_point{};
  r.finished = r.queued + std::chrono::microseconds(20500);
  r.cause = cause;
  r.finish_reason = reason;
  r.error = std::move(error);
  return r;
}

TEST(RequestLog, WritesOneJsonLinePerRequestWithTheFields) {
  Logger log(LogLevel::kSilent);
  const std::string path = temp_path("requests.jsonl");
  {
    auto rl = RequestLog::open(path, log);
    rl->write("bloom", 1, record(EndCause::kFinished, FinishReason::kLength, true), "openai");
    rl->write("bloom", 1, record(EndCause::kFinished, FinishReason::kEos, true), "kserve");
    rl->write("t5", 2, record(EndCause::kCancelled, FinishReason::kCancelled, false), "generate");
    rl->write("t5", 2,
              record(EndCause::kError, FinishReason::kCancelled, true, "kernel \"x\" failed\nhere"),
              "grpc");
    rl->write("t5", 2,
              record(EndCause::kQueueTimeout, FinishReason::kCancelled, false, "timed out"),
              "openai");
    // Visible before the log is closed: each line is written through at once (tail -f).
    EXPECT_EQ(read_lines(path).size(), 5u);
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 5u);
  std::vector<nlohmann::json> j;
  for (const std::string& line : lines) j.push_back(nlohmann::json::parse(line));
  // YYYY-MM-DDTHH:MM:SS.mmmZ, digit for digit (std::regex is not used: GCC 12 warns inside it at
  // -O1 with the sanitizers, and the ASan stage builds this file with -Werror).
  auto iso = [](const std::string& t) {
    const std::string shape = "dddd-dd-ddTdd:dd:dd.dddZ";
    if (t.size() != shape.size()) return false;
    for (size_t i = 0; i < t.size(); ++i)
      if (shape[i] == 'd' ? !std::isdigit(static_cast<unsigned char>(t[i])) : t[i] != shape[i])
        return false;
    return true;
  };
  for (const auto& e : j) {
    EXPECT_TRUE(iso(e["time"].get<std::string>())) << e.dump();
    for (const char* key : {"time", "model", "version", "protocol", "input_tokens", "output_tokens",
                            "queue_ms", "ttft_ms", "total_ms", "finish_reason"})
      EXPECT_TRUE(e.contains(key)) << key << " in " << e.dump();
  }
  // The fields in the documented order.
  EXPECT_EQ(lines[0].rfind("{\"time\":", 0), 0u);
  EXPECT_LT(lines[0].find("\"model\""), lines[0].find("\"finish_reason\""));
  EXPECT_EQ(j[0]["model"], "bloom");
  EXPECT_EQ(j[0]["version"], 1);
  EXPECT_EQ(j[0]["protocol"], "openai");
  EXPECT_EQ(j[0]["input_tokens"], 5);
  EXPECT_EQ(j[0]["output_tokens"], 12);
  EXPECT_DOUBLE_EQ(j[0]["queue_ms"].get<double>(), 3.1);
  EXPECT_DOUBLE_EQ(j[0]["ttft_ms"].get<double>(), 3.1);
  EXPECT_DOUBLE_EQ(j[0]["total_ms"].get<double>(), 20.5);
  EXPECT_EQ(j[0]["finish_reason"], "length");
  EXPECT_FALSE(j[0].contains("error"));
  EXPECT_EQ(j[1]["finish_reason"], "stop");
  EXPECT_EQ(j[2]["finish_reason"], "cancelled");
  EXPECT_TRUE(j[2]["ttft_ms"].is_null()) << "no token came";
  EXPECT_DOUBLE_EQ(j[2]["queue_ms"].get<double>(), 20.5) << "queued until the end";
  EXPECT_EQ(j[3]["finish_reason"], "error");
  EXPECT_EQ(j[3]["error"], "kernel \"x\" failed\nhere");
  EXPECT_EQ(j[4]["finish_reason"], "timeout");
}

TEST(RequestLog, AppendsAndKeepsWholeLinesUnderConcurrentWriters) {
  Logger log(LogLevel::kSilent);
  const std::string path = temp_path("concurrent.jsonl");
  { std::ofstream(path) << "{\"earlier\": true}\n"; }
  auto rl = RequestLog::open(path, log);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i)
        rl->write("m" + std::to_string(t), i,
                  record(EndCause::kFinished, FinishReason::kLength, true), "openai");
    });
  for (auto& th : threads) th.join();
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 401u);
  EXPECT_EQ(lines[0], "{\"earlier\": true}");
  for (size_t i = 1; i < lines.size(); ++i)
    EXPECT_TRUE(nlohmann::json::accept(lines[i])) << lines[i];
}

TEST(RequestLog, APathThatCannotBeOpenedIsAnErrorNamingIt) {
  Logger log(LogLevel::kSilent);
  const std::string missing_dir = temp_path("no-such-dir") + "/requests.jsonl";
  try {
    RequestLog::open(missing_dir, log);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing_dir), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
  const std::string dir = fs::path(KILN_TEST_TMP).string();
  try {
    RequestLog::open(dir, log);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
}

TEST(RequestLog, AFailingWriteWarnsOnceAndNeverThrows) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string sink_path = temp_path("warnings.txt");
  FILE* sink = std::fopen(sink_path.c_str(), "w+");
  ASSERT_NE(sink, nullptr);
  {
    Logger log(LogLevel::kWarning, sink);
    auto rl = RequestLog::open("/dev/full", log);
    for (int i = 0; i < 3; ++i)
      EXPECT_NO_THROW(
          rl->write("m", 1, record(EndCause::kFinished, FinishReason::kEos, true), "x"));
  }
  std::fclose(sink);
  const auto lines = read_lines(sink_path);
  ASSERT_EQ(lines.size(), 1u) << "one warning, not one per request";
  EXPECT_NE(lines[0].find("/dev/full"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("No space left on device"), std::string::npos) << lines[0];
}

// --- the metrics port -------------------------------------------------------------------------

TEST(MetricsFrontend, ServesMetricsOnAFreePortAndJson404Elsewhere) {
  Logger log(LogLevel::kSilent);
  ModelManager models(ManagerOptions{}, log);
  MetricsFrontend front(models, "127.0.0.1", 0, log, /*gpu_metrics=*/false);
  front.start();
  ASSERT_GT(front.port(), 0);
  httplib::Client client("127.0.0.1", front.port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(res->body.find("# TYPE nv_inference_request_success counter"), std::string::npos);
  auto other = client.Get("/v2/health/ready");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  const auto j = nlohmann::json::parse(other->body);
  EXPECT_NE(j["error"].get<std::string>().find("/v2/health/ready"), std::string::npos);
  auto post = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_GE(post->status, 400);
  EXPECT_TRUE(nlohmann::json::accept(post->body)) << post->body;
  front.stop();
  front.stop();  // idempotent
}

TEST(MetricsFrontend, APortInUseIsAnErrorNamingIt) {
  Logger log(LogLevel::kSilent);
  ModelManager models(ManagerOptions{}, log);
  MetricsFrontend first(models, "127.0.0.1", 0, log, false);
  first.start();
  MetricsFrontend second(models, "127.0.0.1", first.port(), log, false);
  try {
    second.start();
    FAIL() << "expected an error";
  } catch (const ServerError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())),
              std::string::npos)
        << e.what();
  }
}

TEST(MetricsFrontend, StopRightAfterStartReturns) {
  Logger log(LogLevel::kSilent);
  ModelManager models(ManagerOptions{}, log);
  for (int i = 0; i < 20; ++i) {
    MetricsFrontend front(models, "127.0.0.1", 0, log, false);
    front.start();
    front.stop();
  }
}

TEST(MetricsFrontend, ARealModelsRequestShowsOnThePage) {
  Logger log(LogLevel::kSilent);
  ModelManager models(ManagerOptions{}, log);
  ModelSettings settings;
  settings.name = "micro-bloom";
  models.add_plan(std::string(KILN_SOURCE_DIR) + "/tests/data/plans/v3/micro-bloom.plan", settings);
  const std::string log_path = temp_path("e2e.jsonl");
  auto request_log = RequestLog::open(log_path, log);
  auto model = models.get("micro-bloom");
  model->executor(0).set_observer([&](const RequestRecord& r) {
    request_log->write(model->name(), model->version(), r, "test");
  });
  MetricsFrontend front(models, "127.0.0.1", 0, log, false);
  front.start();
  {
    TextRequest req;
    req.prompt = "Hello";
    req.params.max_tokens = 4;
    req.params.ignore_eos = true;
    Generation g(model, req);
    const Completion c = collect(g);
    EXPECT_EQ(c.token_ids.size(), 4u);
  }
  // The request's stream ends before the executor publishes its statistics and calls the
  // observer: wait for both.
  const std::map<std::string, std::string> l = {{"model", "micro-bloom"}, {"version", "1"}};
  httplib::Client client("127.0.0.1", front.port());
  std::string body;
  Page page;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    auto res = client.Get("/metrics");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200);
    body = res->body;
    page = parse_page(body);
    if (value_of(page, "nv_inference_request_success", l) == "1" &&
        read_lines(log_path).size() == 1)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < until);
  EXPECT_EQ(value_of(page, "nv_inference_request_success", l), "1");
  EXPECT_EQ(value_of(page, "nv_inference_count", l), "1");
  EXPECT_EQ(value_of(page, "kiln_kv_blocks_used", l), "0") << "the finished request's blocks";
  EXPECT_EQ(value_of(page, "kiln_output_tokens_total", l), "4");
  EXPECT_EQ(value_of(page, "kiln_time_to_first_token_seconds_count", l), "1");
  EXPECT_EQ(value_of(page, "kiln_generated_tokens_per_request_count", l), "1");
  EXPECT_EQ(value_of(page, "kiln_model_instances", l), "1");
  EXPECT_EQ(value_of(page, "nv_inference_pending_request_count", l), "0");
  EXPECT_GT(std::stoll(value_of(page, "nv_inference_exec_count", l)), 0);
  const auto lines = read_lines(log_path);
  ASSERT_EQ(lines.size(), 1u);
  const auto j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j["model"], "micro-bloom");
  EXPECT_EQ(j["output_tokens"], 4);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_TRUE(j["ttft_ms"].is_number());
  model->executor(0).set_observer(nullptr);  // request_log goes before the model
  // The sample scrape and log line of docs/serving-metrics.md come from here.
  if (std::getenv("KILN_PRINT_METRICS") != nullptr)
    std::printf("%s\n%s\n", body.c_str(), lines[0].c_str());
}

}  // namespace
}  // namespace kiln::server
