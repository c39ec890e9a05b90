#include "passes/calibration_cache.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/status.h"
#include "graph/linear.h"
#include "io/atomic_file.h"
#include "io/hash.h"

namespace kiln {
namespace {

constexpr const char* kMagic = "kiln-calibration-cache";
constexpr int kVersion = 1;          // scales only
constexpr int kSmoothedVersion = 2;  // and SmoothQuant's factors
constexpr int kFallbackVersion = 3;  // and the sensitivity fallback's tolerance and layers
constexpr int kAwqVersion = 4;       // AWQ's factors alone (method=awq)

// A number of the whole of `text` (from_chars: no locale, no trailing characters).
template <typename T>
bool parse_number(const std::string& text, T* value) {
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return err == std::errc() && end == text.data() + text.size();
}

bool has_space(const std::string& s) {
  return std::any_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

// "a, b, c and 4 more"
std::string first_few(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::string out;
  for (size_t i = 0; i < std::min(names.size(), kShown); ++i)
    out += (i == 0 ? "" : ", ") + names[i];
  if (names.size() > kShown) out += fmt::format(" and {} more", names.size() - kShown);
  return out;
}

}  // namespace

std::string fallback_reason(const LayerSensitivity& error, double quant_tolerance) {
  return fmt::format(
      "sensitivity fallback: int8 alone moves the next-token distributions by mean KL {:.3g} "
      "nats/token (top-1 agreement {:.1f} %) against fp32 on the calibration prompts; kept "
      "float so that the whole model's mean KL is at most --quant-tolerance {:g}",
      error.mean_kl, 100.0 * error.top1_agreement, quant_tolerance);
}

std::string calibrated_tensor_name(const Graph& graph, int value) {
  return graph.name + "/" + graph.values[static_cast<size_t>(value)].name;
}

std::vector<std::string> calibrated_tensors(const ModelIR& model) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const Graph& g : model.graphs)
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kLinear) continue;
      const std::string name = calibrated_tensor_name(g, linear_operand(n, LinearOperand::kX));
      if (seen.insert(name).second) out.push_back(name);
    }
  return out;
}

std::string calibration_fingerprint(const ModelIR& model) {
  KILN_CHECK_USAGE(!model.weights_digest.empty(),
                   "the model records no digest of its checkpoint's weights (a plan written "
                   "before kiln recorded one), so a calibration cannot name it: rebuild the plan "
                   "with this kiln's kiln build");
  Hash64 h;
  auto add = [&](const std::string& s) {
    const uint64_t size = s.size();
    h.update(&size, sizeof size);
    h.update(s.data(), s.size());
  };
  add(model.source_config_json);
  add(model.tokenizer_bytes);
  add(model.weights_digest);  // the checkpoint's content: same shapes, other weights differ
  std::set<std::string> seen;
  for (const Graph& g : model.graphs)
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kLinear) continue;
      const int x = linear_operand(n, LinearOperand::kX);
      const std::string name = calibrated_tensor_name(g, x);
      if (!seen.insert(name).second) continue;
      // Names and shapes, not types: the same model calibrated in fp32 and built for bf16
      // activations is the same model.
      add(name);
      add(sym_shape_str(g.values[static_cast<size_t>(x)].shape));
    }
  return hash_hex(h.digest());
}

void write_calibration_cache(const std::string& path, const CalibrationCache& cache) {
  KILN_CHECK(!cache.model.empty() && !has_space(cache.model) && !cache.method.empty() &&
                 !has_space(cache.method),
             "calibration cache {}: the model fingerprint and method must be words", path);
  const bool smoothed = !cache.smoothing.empty() && !cache.awq();
  KILN_CHECK(!cache.awq() || (cache.scales.empty() && cache.quant_tolerance < 0.0 &&
                              cache.smoothquant_alpha == 0.0),
             "calibration cache {}: an AWQ cache holds factors only", path);
  KILN_CHECK(smoothed == (cache.smoothquant_alpha > 0.0) && cache.smoothquant_alpha <= 1.0,
             "calibration cache {}: SmoothQuant alpha {} with {} smoothed tensors", path,
             cache.smoothquant_alpha, cache.smoothing.size());
  const bool fallback = cache.quant_tolerance >= 0.0;
  KILN_CHECK(fallback || cache.fallback.empty(),
             "calibration cache {}: {} layers kept in float without a tolerance", path,
             cache.fallback.size());
  KILN_CHECK(!fallback || std::isfinite(cache.quant_tolerance),
             "calibration cache {}: quant tolerance {}", path, cache.quant_tolerance);
  const int version = cache.awq() ? kAwqVersion
                      : fallback  ? kFallbackVersion
                      : smoothed  ? kSmoothedVersion
                                  : kVersion;
  std::string text =
      fmt::format("{} {} model={} method={}", kMagic, version, cache.model, cache.method);
  if (smoothed) text += fmt::format(" smoothquant={}", cache.smoothquant_alpha);
  if (fallback) text += fmt::format(" quant-tolerance={}", cache.quant_tolerance);
  text += "\n";
  for (const auto& [name, factors] : cache.smoothing) {
    KILN_CHECK(!name.empty() && !has_space(name) && !factors.empty(),
               "calibration cache {}: smoothed tensor '{}' is unnamed or has no factors", path,
               name);
    text += "smooth " + name;
    for (float f : factors) {
      KILN_CHECK(std::isfinite(f) && f > 0.0f,
                 "calibration cache {}: smoothed tensor {} has factor {}", path, name, f);
      text += fmt::format(" {}", f);
    }
    text += "\n";
  }
  for (const auto& [name, error] : cache.fallback) {
    KILN_CHECK(!name.empty() && !has_space(name) && std::isfinite(error.mean_kl) &&
                   error.mean_kl >= 0.0 && error.top1_agreement >= 0.0 &&
                   error.top1_agreement <= 1.0,
               "calibration cache {}: layer '{}' kept in float with mean KL {} and top-1 "
               "agreement {}",
               path, name, error.mean_kl, error.top1_agreement);
    text += fmt::format("float {} {} {}\n", name, error.mean_kl, error.top1_agreement);
  }
  for (const auto& [name, scale] : cache.scales) {
    KILN_CHECK(!name.empty() && !has_space(name),
               "calibration cache {}: tensor name '{}' is empty or holds whitespace", path, name);
    KILN_CHECK(std::isfinite(scale) && scale >= 0.0f,
               "calibration cache {}: tensor {} has scale {}", path, name, scale);
    text += fmt::format("{} {}\n", name, scale);  // fmt: the shortest decimal that round-trips
  }
  AtomicFileWriter out(path);
  out.write(text.data(), text.size());
  out.commit();
}

CalibrationCache read_calibration_cache(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    KILN_FAIL_KIND(ErrorKind::kNotFound, "calibration cache {}: no such file", path);
  KILN_CHECK(!std::filesystem::is_directory(path, ec),
             "calibration cache {} is a directory; expected a file", path);
  std::ifstream in(path);
  KILN_CHECK(in.good(), "cannot read calibration cache {}: {}", path, std::strerror(errno));
  CalibrationCache cache;
  std::string line;
  int lineno = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::istringstream words(line);
    if (!header) {
      std::string magic, word;
      int version = 0;
      words >> magic >> version;
      KILN_CHECK(magic == kMagic,
                 "{}:{}: not a kiln calibration cache (the first line should start with '{}')",
                 path, lineno, kMagic);
      KILN_CHECK(version >= kVersion && version <= kAwqVersion,
                 "{}:{}: calibration cache version {}; this kiln reads {} to {}", path, lineno,
                 version, kVersion, kAwqVersion);
      // key=value words: model and method always; smoothquant in version 2 (and 3, when
      // smoothed); quant-tolerance in version 3.
      std::map<std::string, std::string> keys;
      while (words >> word) {
        const size_t eq = word.find('=');
        KILN_CHECK(eq != std::string::npos && eq > 0, "{}:{}: '{}' in the header is not KEY=VALUE",
                   path, lineno, word);
        const std::string key = word.substr(0, eq);
        const bool known = key == "model" || key == "method" ||
                           (key == "smoothquant" && version >= kSmoothedVersion) ||
                           (key == "quant-tolerance" && version >= kFallbackVersion);
        KILN_CHECK(known, "{}:{}: '{}' is not a header field of calibration cache version {}", path,
                   lineno, key, version);
        KILN_CHECK(keys.emplace(key, word.substr(eq + 1)).second,
                   "{}:{}: header field '{}' is given twice", path, lineno, key);
      }
      const bool smoothed = keys.count("smoothquant") != 0;
      KILN_CHECK(keys.count("model") && keys.count("method") &&
                     (version != kSmoothedVersion || smoothed) &&
                     (version != kFallbackVersion || keys.count("quant-tolerance")),
                 "{}:{}: expected '{} {} model=FINGERPRINT method=METHOD{}{}'", path, lineno,
                 kMagic, version, version == kSmoothedVersion ? " smoothquant=ALPHA" : "",
                 version == kFallbackVersion ? " [smoothquant=ALPHA] quant-tolerance=KL" : "");
      cache.model = keys["model"];
      cache.method = keys["method"];
      KILN_CHECK(!cache.model.empty() && !cache.method.empty(),
                 "{}:{}: the model fingerprint or the method is empty", path, lineno);
      KILN_CHECK((version == kAwqVersion) == cache.awq(),
                 "{}:{}: method={} in a version {} cache (version {} is method=awq's alone)", path,
                 lineno, cache.method, version, kAwqVersion);
      if (smoothed) {
        const std::string& alpha = keys["smoothquant"];
        KILN_CHECK(parse_number(alpha, &cache.smoothquant_alpha) && cache.smoothquant_alpha > 0.0 &&
                       cache.smoothquant_alpha <= 1.0,
                   "{}:{}: smoothquant={} is not a number in (0, 1]", path, lineno, alpha);
      }
      if (version == kFallbackVersion) {
        const std::string& tol = keys["quant-tolerance"];
        KILN_CHECK(parse_number(tol, &cache.quant_tolerance) &&
                       std::isfinite(cache.quant_tolerance) && cache.quant_tolerance >= 0.0,
                   "{}:{}: quant-tolerance={} is not a finite non-negative number", path, lineno,
                   tol);
      }
      header = true;
      continue;
    }
    std::string name, scale_text, rest;
    words >> name;
    if (name == "float") {
      KILN_CHECK(cache.quant_tolerance >= 0.0,
                 "{}:{}: a 'float' line in a cache without quant-tolerance= in its header", path,
                 lineno);
      std::string node, kl, top1;
      words >> node >> kl >> top1;
      LayerSensitivity error;
      KILN_CHECK(!top1.empty() && !(words >> rest) && parse_number(kl, &error.mean_kl) &&
                     parse_number(top1, &error.top1_agreement) && std::isfinite(error.mean_kl) &&
                     error.mean_kl >= 0.0 && error.top1_agreement >= 0.0 &&
                     error.top1_agreement <= 1.0,
                 "{}:{}: expected 'float NODE MEAN_KL TOP1_AGREEMENT' (KL >= 0, agreement in "
                 "[0, 1]), got '{}'",
                 path, lineno, line);
      KILN_CHECK(cache.fallback.emplace(node, error).second,
                 "{}:{}: layer {} is kept in float twice", path, lineno, node);
      continue;
    }
    KILN_CHECK(!cache.awq() || name == "smooth",
               "{}:{}: an AWQ cache holds 'smooth TENSOR F0 F1 ...' lines only, got '{}'", path,
               lineno, line);
    if (name == "smooth") {
      KILN_CHECK(cache.smoothquant_alpha > 0.0 || cache.awq(),
                 "{}:{}: a 'smooth' line in a cache without smoothquant= in its header", path,
                 lineno);
      std::string tensor, f;
      words >> tensor;
      std::vector<float> factors;
      while (words >> f) {
        float v = 0.0f;
        const auto [end, err] = std::from_chars(f.data(), f.data() + f.size(), v);
        KILN_CHECK(err == std::errc() && end == f.data() + f.size() && std::isfinite(v) && v > 0.0f,
                   "{}:{}: smoothed tensor {}: factor '{}' is not a finite positive number", path,
                   lineno, tensor, f);
        factors.push_back(v);
      }
      KILN_CHECK(!tensor.empty() && !factors.empty(),
                 "{}:{}: expected 'smooth TENSOR F0 F1 ...', got '{}'", path, lineno, line);
      KILN_CHECK(cache.smoothing.emplace(tensor, std::move(factors)).second,
                 "{}:{}: smoothed tensor {} is listed twice", path, lineno, tensor);
      continue;
    }
    words >> scale_text;
    KILN_CHECK(!scale_text.empty() && !(words >> rest), "{}:{}: expected 'TENSOR SCALE', got '{}'",
               path, lineno, line);
    float scale = 0.0f;
    const auto [end, err] =
        std::from_chars(scale_text.data(), scale_text.data() + scale_text.size(), scale);
    KILN_CHECK(err == std::errc() && end == scale_text.data() + scale_text.size() &&
                   std::isfinite(scale) && scale >= 0.0f,
               "{}:{}: tensor {}: scale '{}' is not a finite non-negative number", path, lineno,
               name, scale_text);
    KILN_CHECK(cache.scales.emplace(name, scale).second, "{}:{}: tensor {} is listed twice", path,
               lineno, name);
  }
  KILN_CHECK(!in.bad(), "cannot read calibration cache {}: {}", path, std::strerror(errno));
  KILN_CHECK(header, "calibration cache {} is empty (expected a '{}' header line)", path, kMagic);
  KILN_CHECK(cache.smoothquant_alpha == 0.0 || !cache.smoothing.empty(),
             "calibration cache {}: smoothquant={} but no 'smooth' lines", path,
             cache.smoothquant_alpha);
  return cache;
}

void check_calibration_cache(const CalibrationCache& cache, const std::string& source,
                             const std::string& fingerprint,
                             const std::vector<std::string>& expected) {
  KILN_CHECK_USAGE(cache.model == fingerprint,
                   "calibration cache {} was made for another model (fingerprint {}; this model's "
                   "is {}): calibrate this model again",
                   source, cache.model, fingerprint);
  std::vector<std::string> missing, extra;
  const std::set<std::string> wanted(expected.begin(), expected.end());
  for (const std::string& name : expected)
    if (!cache.scales.contains(name)) missing.push_back(name);
  for (const auto& [name, scale] : cache.scales)
    if (!wanted.contains(name)) extra.push_back(name);
  KILN_CHECK_USAGE(missing.empty() && extra.empty(),
                   "calibration cache {} does not match the model's tensors:{}{}", source,
                   missing.empty() ? "" : " missing " + first_few(missing) + ";",
                   extra.empty() ? "" : " not in the model " + first_few(extra) + ";");
  std::vector<std::string> stray;
  for (const auto& [name, factors] : cache.smoothing)
    if (!wanted.contains(name)) stray.push_back(name);
  KILN_CHECK_USAGE(stray.empty(), "calibration cache {} smooths tensors the model lacks: {}",
                   source, first_few(stray));
}

}  // namespace kiln
