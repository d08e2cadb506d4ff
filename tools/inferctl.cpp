// inferctl — the command-line client of the inferd daemon: load and unload models, show what runs,
// generate, chat and measure throughput. Uses only libinferd-client's public API (inferd/client.h).
//
// Single-threaded except `bench`, which runs one Client per thread (a Client is bound to its thread).
// SIGINT during generate/chat cancels the generation through the client's cancel fd (a self-pipe the
// handler writes to), so the daemon frees the slot and what was generated so far is kept.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <iterator>
#include <latch>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "inferd/client.h"

namespace {

using namespace inferd::client;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Exit codes; `inferctl --help` lists them.
constexpr int kExitOk = 0;
constexpr int kExitRefused = 1;       // the daemon refused the request (FAILED, UNIMPLEMENTED)
constexpr int kExitUsage = 2;
constexpr int kExitConnect = 3;
constexpr int kExitOverloaded = 4;
constexpr int kExitDisconnected = 5;  // the connection or the worker running the request died
constexpr int kExitInterrupted = 130;

int exit_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kFailed:
    case ErrorKind::kUnimplemented: return kExitRefused;
    case ErrorKind::kConnect: return kExitConnect;
    case ErrorKind::kOverloaded: return kExitOverloaded;
    case ErrorKind::kDisconnected: return kExitDisconnected;
  }
  return kExitRefused;
}

// A mistake on the command line (exit 2).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------------------------------------------
// Formatting

// Binary units, one decimal: "512 B", "1.5 KiB", "101.4 MiB".
std::string format_bytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  size_t unit = 0;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[unit]);
  return buf;
}

// "850ms", "12.3s", "3m12s", "2h05m", "3d04h".
std::string format_duration(double ms) {
  char buf[32];
  if (!(ms >= 0)) ms = 0;
  if (ms < 1000) {
    std::snprintf(buf, sizeof(buf), "%.0fms", ms);
    return buf;
  }
  if (ms < 60'000) {
    std::snprintf(buf, sizeof(buf), "%.1fs", ms / 1000);
    return buf;
  }
  const uint64_t s = static_cast<uint64_t>(ms / 1000);
  if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
  } else if (s < 86'400) {
    std::snprintf(buf, sizeof(buf), "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%" PRIu64 "d%02" PRIu64 "h", s / 86'400, s / 3600 % 24);
  }
  return buf;
}

// What a table shows for an empty field (e.g. a model still loading).
std::string or_dash(const std::string& s) { return s.empty() ? "-" : s; }

// The placement plan as table rows: one per assignment ("worker 0 (cpu): embeddings, layers 0-14,
// 157 operators"), then one per tensor that crosses workers.
void add_plan_rows(const Placement& p, std::vector<std::vector<std::string>>& rows) {
  for (const PlacementAssignment& a : p.assignments) {
    std::string what;
    auto add = [&](const std::string& s) { what += (what.empty() ? "" : ", ") + s; };
    if (a.embeddings) add("embeddings");
    if (a.end_layer > a.first_layer) {
      add(a.end_layer - a.first_layer == 1 ? "layer " + std::to_string(a.first_layer)
                                           : "layers " + std::to_string(a.first_layer) + "-" +
                                                 std::to_string(a.end_layer - 1));
    }
    if (a.output) add("output");
    if (!a.operators.empty()) {
      std::string ops;
      for (const std::string& op : a.operators) ops += (ops.empty() ? "" : ", ") + op;
      what += " (" + ops + " only)";
    }
    if (a.neuron_end > 0) {
      what += " (FFN neurons " + std::to_string(a.neuron_begin) + "-" + std::to_string(a.neuron_end - 1) + ")";
    }
    rows.push_back({"plan", "worker " + std::to_string(a.worker) + " (" + a.backend + "): " + what + ", " +
                                std::to_string(a.nodes) + " operators"});
  }
  for (const PlacementExchange& x : p.exchanges) {
    rows.push_back({"exchange", x.tensor + ": worker " + std::to_string(x.from_worker) + " -> " +
                                    std::to_string(x.to_worker) + ", " + std::to_string(x.floats_per_token) +
                                    " floats per token, " + x.via});
  }
}

std::string format_double(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

// Left-aligned columns two spaces apart; the last column is not padded.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  std::string render(const std::string& indent = "") const {
    std::vector<size_t> width;
    for (const auto& row : rows_) {
      if (width.size() < row.size()) width.resize(row.size(), 0);
      for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
    }
    std::string out;
    for (const auto& row : rows_) {
      std::string line = indent;
      for (size_t i = 0; i < row.size(); ++i) {
        line += row[i];
        if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
      }
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// Nearest-rank percentile of unsorted values (0 for none).
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

// "a,b,c" -> unsigned numbers in [1, max]; `increasing` also requires each to exceed the previous.
// Anything else throws UsageError(`what` ... `s`).
std::vector<uint32_t> parse_u32_list(const std::string& s, unsigned long max, bool increasing, const std::string& what) {
  std::vector<uint32_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    errno = 0;
    const unsigned long v = std::strtoul(item.c_str(), &end, 10);
    if (item.empty() || item[0] == '-' || *end != '\0' || errno != 0 || v == 0 || v > max ||
        (increasing && !out.empty() && v <= out.back())) {
      throw UsageError(what + ", got '" + s + "'");
    }
    out.push_back(static_cast<uint32_t>(v));
  }
  if (out.empty()) throw UsageError(what + ", got nothing");
  return out;
}

// "1,4,16" -> {1, 4, 16}.
std::vector<uint32_t> parse_stream_counts(const std::string& s) {
  return parse_u32_list(s, 1024, false, "--streams expects a comma-separated list of counts in [1, 1024]");
}

// "15" or "10,20" -> {15} / {10, 20}: strictly increasing layer indices.
std::vector<uint32_t> parse_layer_split(const std::string& s) {
  return parse_u32_list(s, UINT32_MAX, true, "--layer-split expects increasing layer numbers separated by commas");
}

// "opencl,cpu" -> {"opencl", "cpu"}: one backend per pipeline stage. The daemon checks the names and
// their number against the layer split.
std::vector<std::string> parse_stage_backends(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) throw UsageError("--stage-backends expects backend names separated by commas, got '" + s + "'");
    out.push_back(item);
  }
  if (out.empty() || s.back() == ',') {
    throw UsageError("--stage-backends expects backend names separated by commas, got '" + s + "'");
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
// Command-line parsing: `inferctl [global options] COMMAND [options and arguments]`, options in any
// position, repeated options kept in order, `--name=value` or `--name value`.

struct OptionSpec {
  std::vector<std::string> names;  // the last one (the long name) is the key
  std::string metavar;             // empty: a flag
  std::string help;
};

class Args {
 public:
  Args(const std::vector<OptionSpec>& specs, const std::vector<std::string>& argv) {
    bool only_positional = false;
    for (size_t i = 0; i < argv.size(); ++i) {
      std::string arg = argv[i];
      if (only_positional || arg.size() < 2 || arg[0] != '-') {
        positional_.push_back(arg);
        continue;
      }
      if (arg == "--") {
        only_positional = true;
        continue;
      }
      std::optional<std::string> value;
      if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg.resize(eq);
      }
      const OptionSpec* spec = find(specs, arg);
      if (spec == nullptr) throw UsageError("unknown option '" + arg + "'");
      const std::string& key = spec->names.back();
      if (spec->metavar.empty()) {
        if (value) throw UsageError(arg + " takes no value");
        values_[key].push_back("");
        continue;
      }
      if (!value) {
        if (i + 1 >= argv.size()) throw UsageError(arg + " needs a value (" + spec->metavar + ")");
        value = argv[++i];
      }
      values_[key].push_back(*value);
    }
  }

  const std::vector<std::string>& positional() const { return positional_; }
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  std::vector<std::string> all(const std::string& key) const {
    auto it = values_.find(key);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  // The last value given, if any.
  std::optional<std::string> get(const std::string& key) const {
    auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    return it->second.back();
  }

  uint32_t u32(const std::string& key, uint32_t fallback) const {
    return static_cast<uint32_t>(integer(key, fallback, 0, UINT32_MAX));
  }
  int32_t i32(const std::string& key, int32_t fallback) const {
    return static_cast<int32_t>(integer(key, fallback, INT32_MIN, INT32_MAX));
  }
  uint64_t u64(const std::string& key, uint64_t fallback) const {
    auto v = get(key);
    if (!v) return fallback;
    char* end = nullptr;
    errno = 0;
    const unsigned long long r = std::strtoull(v->c_str(), &end, 10);
    if (v->empty() || (*v)[0] == '-' || *end != '\0' || errno != 0) {
      throw UsageError(key + " expects a non-negative integer, got '" + *v + "'");
    }
    return r;
  }
  float f32(const std::string& key, float fallback) const {
    auto v = get(key);
    if (!v) return fallback;
    char* end = nullptr;
    errno = 0;
    const float r = std::strtof(v->c_str(), &end);
    if (v->empty() || *end != '\0' || errno != 0 || !std::isfinite(r)) {
      throw UsageError(key + " expects a number, got '" + *v + "'");
    }
    return r;
  }

 private:
  static const OptionSpec* find(const std::vector<OptionSpec>& specs, const std::string& name) {
    for (const OptionSpec& s : specs) {
      if (std::find(s.names.begin(), s.names.end(), name) != s.names.end()) return &s;
    }
    return nullptr;
  }

  int64_t integer(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const {
    auto v = get(key);
    if (!v) return fallback;
    char* end = nullptr;
    errno = 0;
    const long long r = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || errno != 0 || r < lo || r > hi) {
      throw UsageError(key + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "], got '" + *v + "'");
    }
    return r;
  }

  std::vector<std::string> positional_;
  std::map<std::string, std::vector<std::string>> values_;
};

// ------------------------------------------------------------------------------------------------
// JSON

const char* state_name(ModelState s) { return to_string(s); }

// The state, with a loading model's progress: "loading (copying 42%)".
std::string state_text(const ModelInfo& m) {
  std::string s = state_name(m.state);
  if (m.state != ModelState::kLoading || m.load_stage.empty()) return s;
  s += " (" + m.load_stage;
  if (m.load_total > 1) s += " " + std::to_string(static_cast<int>(100.0 * static_cast<double>(m.load_done) / static_cast<double>(m.load_total))) + "%";
  return s + ")";
}

const char* finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::kEndOfGeneration: return "end_of_generation";
    case FinishReason::kMaxTokens: return "max_tokens";
    case FinishReason::kStop: return "stop";
    case FinishReason::kContextFull: return "context_full";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

Json to_json(const WorkerInfo& w) {
  return Json{{"index", w.index},         {"backend", w.backend},
              {"pid", w.pid},             {"state", w.state},
              {"rss_bytes", w.rss_bytes}, {"shared_bytes", w.shared_bytes},
              {"uptime_ms", w.uptime_ms}, {"restarts", w.restarts},
              {"last_restart_ms", w.last_restart_ms}, {"steps", w.steps},
              {"tokens", w.tokens},       {"device", w.device}};
}

Json to_json(const ModelInfo& m) {
  Json stages = Json::array();
  for (const PlacementStage& s : m.placement.stages) {
    stages.push_back({{"worker", s.worker},
                      {"backend", s.backend},
                      {"first_layer", s.first_layer},
                      {"end_layer", s.end_layer},
                      {"embeddings", s.embeddings},
                      {"output", s.output}});
  }
  Json assignments = Json::array();
  for (const PlacementAssignment& a : m.placement.assignments) {
    assignments.push_back({{"worker", a.worker},
                           {"backend", a.backend},
                           {"embeddings", a.embeddings},
                           {"first_layer", a.first_layer},
                           {"end_layer", a.end_layer},
                           {"output", a.output},
                           {"operators", a.operators},
                           {"neuron_begin", a.neuron_begin},
                           {"neuron_end", a.neuron_end},
                           {"nodes", a.nodes}});
  }
  Json exchanges = Json::array();
  for (const PlacementExchange& x : m.placement.exchanges) {
    exchanges.push_back({{"from_worker", x.from_worker},
                         {"to_worker", x.to_worker},
                         {"tensor", x.tensor},
                         {"floats_per_token", x.floats_per_token},
                         {"via", x.via}});
  }
  Json workers = Json::array();
  for (const WorkerInfo& w : m.workers) workers.push_back(to_json(w));
  return Json{{"id", m.id},
              {"path", m.path},
              {"name", m.name},
              {"arch", m.arch},
              {"description", m.description},
              {"state", state_name(m.state)},
              {"weights_bytes", m.weights_bytes},
              {"weights_huge_page_bytes", m.weights_huge_page_bytes},
              {"context_size", m.context_size},
              {"parallel", m.parallel},
              {"vocab_size", m.vocab_size},
              {"chat_template", m.chat_template},
              {"placement",
               {{"summary", m.placement.summary},
                {"stages", stages},
                {"assignments", assignments},
                {"exchanges", exchanges}}},
              {"workers", workers},
              {"load_ms", m.load_ms},
              {"keep_alive_s", m.keep_alive_s},
              {"unload_in_s", m.unload_in_s},
              {"load_stage", m.load_stage},
              {"load_done", m.load_done},
              {"load_total", m.load_total}};
}

Json to_json(const DaemonStatus& s) {
  Json models = Json::array();
  for (const ModelStatus& m : s.models) {
    models.push_back({{"info", to_json(m.info)},
                      {"kv_bytes", m.kv_bytes},
                      {"slots_used", m.slots_used},
                      {"kv_tokens_used", m.kv_tokens_used},
                      {"requests_active", m.requests_active},
                      {"requests_queued", m.requests_queued},
                      {"requests_done", m.requests_done},
                      {"requests_failed", m.requests_failed},
                      {"prompt_tokens", m.prompt_tokens},
                      {"generated_tokens", m.generated_tokens},
                      {"decode_tokens_per_second", m.decode_tokens_per_second},
                      {"replays", m.replays},
                      {"step_compute_us", m.step_compute_us},
                      {"step_overhead_us", m.step_overhead_us},
                      {"cache_blocks", m.cache_blocks},
                      {"cache_blocks_used", m.cache_blocks_used},
                      {"cache_blocks_cached", m.cache_blocks_cached},
                      {"cache_hits", m.cache_hits},
                      {"cache_hit_tokens", m.cache_hit_tokens},
                      {"cache_evictions", m.cache_evictions}});
  }
  return Json{{"version", s.version},
              {"protocol_version", s.protocol_version},
              {"pid", s.pid},
              {"uptime_ms", s.uptime_ms},
              {"socket_path", s.socket_path},
              {"models", models},
              {"connections", s.connections},
              {"requests_total", s.requests_total},
              {"requests_rejected", s.requests_rejected},
              {"rss_bytes", s.rss_bytes}};
}

Json to_json(const GenerateResult& r) {
  return Json{{"finish_reason", finish_name(r.finish_reason)},
              {"prompt_tokens", r.prompt_tokens},
              {"generated_tokens", r.generated_tokens},
              {"seed", r.seed},
              {"queue_ms", r.queue_ms},
              {"time_to_first_token_ms", r.time_to_first_token_ms},
              {"prompt_ms", r.prompt_ms},
              {"generate_ms", r.generate_ms},
              {"replays", r.replays},
              {"cached_tokens", r.cached_tokens}};
}

// Model output need not be valid UTF-8 at every cut; never let that abort the dump.
void print_json(const Json& j) {
  std::puts(j.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
}

// ------------------------------------------------------------------------------------------------
// SIGINT -> cancel the running generation.

int g_cancel_pipe[2] = {-1, -1};
volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_sigint(int) {
  g_interrupted = 1;
  const int saved = errno;
  const ssize_t n = ::write(g_cancel_pipe[1], "x", 1);  // non-blocking: a full pipe already cancels
  (void)n;
  errno = saved;
}

// Installs the handler without SA_RESTART, so a blocking read of stdin returns on ^C as well.
void cancel_generation_on_sigint(Client& client) {
  if (g_cancel_pipe[0] < 0) {
    if (::pipe2(g_cancel_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    }
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(SIGINT, &sa, nullptr);
  }
  client.set_cancel_fd(g_cancel_pipe[0]);
}

// ------------------------------------------------------------------------------------------------
// Commands

struct Context {
  const Args& args;
  std::string socket;
  bool json = false;

  Client connect(const char* name = "inferctl") const { return Client(socket, name); }
};

// -m, or the only loaded model.
std::string resolve_model(Client& client, const Args& args) {
  if (auto m = args.get("--model")) return *m;
  std::vector<ModelInfo> models = client.list();
  if (models.empty()) throw Error(ErrorKind::kFailed, "no model is loaded (load one with: inferctl load PATH)");
  if (models.size() > 1) {
    std::string ids;
    for (const ModelInfo& m : models) ids += (ids.empty() ? "" : ", ") + m.id;
    throw UsageError("several models are loaded (" + ids + "): choose one with -m");
  }
  return models[0].id;
}

void expect_positional(const Args& args, size_t n, const char* what) {
  if (args.positional().size() != n) {
    throw UsageError(std::string("expected ") + what + ", got " + std::to_string(args.positional().size()) +
                     " arguments");
  }
}

std::string workers_summary(const ModelInfo& m) {
  size_t ready = 0;
  for (const WorkerInfo& w : m.workers) ready += w.state == "ready";
  return std::to_string(ready) + "/" + std::to_string(m.workers.size()) + " ready";
}

void print_model(const ModelInfo& m) {
  std::printf("%s  %s%s\n", m.id.c_str(), state_text(m).c_str(),
              m.load_ms > 0 ? (", loaded in " + format_duration(m.load_ms)).c_str() : "");
  Table t({"", ""});
  t.add({"path", m.path});
  t.add({"model", m.name.empty() ? m.arch : m.name + " (" + m.arch + ")"});
  if (!m.description.empty()) t.add({"description", m.description});
  t.add({"weights", format_bytes(m.weights_bytes) + " in shared memory, " + format_bytes(m.weights_huge_page_bytes) +
                        " of it in 2 MiB pages"});
  t.add({"context", std::to_string(m.context_size) + " tokens x " + std::to_string(m.parallel) + " sequences"});
  t.add({"chat", m.chat_template.empty() ? "-" : m.chat_template});
  t.add({"placement", or_dash(m.placement.summary)});
  std::vector<std::vector<std::string>> plan_rows;
  add_plan_rows(m.placement, plan_rows);
  for (auto& row : plan_rows) t.add(std::move(row));
  std::string pids;
  for (const WorkerInfo& w : m.workers) pids += (pids.empty() ? "" : ", ") + std::to_string(w.pid);
  t.add({"workers", workers_summary(m) + (pids.empty() ? "" : " (pid " + pids + ")")});
  // The table's empty header row becomes a blank line; skip it.
  const std::string body = t.render("  ");
  std::fputs(body.substr(body.find('\n') + 1).c_str(), stdout);
}

// Progress on stderr: a redrawn bar on a terminal, one line per stage otherwise.
class LoadProgressPrinter {
 public:
  LoadProgressPrinter() : tty_(::isatty(STDERR_FILENO) == 1) {}
  ~LoadProgressPrinter() { finish(); }

  void update(std::string_view stage, uint64_t done, uint64_t total) {
    const bool counts = stage.find("worker") != std::string_view::npos;  // workers, not bytes
    auto amount = [&](uint64_t v) { return counts ? std::to_string(v) : format_bytes(v); };
    const std::string what = total > 0 ? amount(done) + " / " + amount(total) : "";
    if (!tty_) {
      // One line when a stage starts, one when a measured stage completes.
      if (stage != stage_) {
        std::fprintf(stderr, "%.*s\n", static_cast<int>(stage.size()), stage.data());
        completed_ = false;
      }
      if (total > 1 && done == total && !completed_) {
        std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(stage.size()), stage.data(), what.c_str());
        completed_ = true;
      }
      stage_ = stage;
      return;
    }
    constexpr int kWidth = 30;
    const double frac = total > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 0;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    std::fprintf(stderr, "\r\033[K%-16.*s [%s] %3.0f%%  %s", static_cast<int>(stage.size()), stage.data(),
                 bar.c_str(), frac * 100, what.c_str());
    std::fflush(stderr);
    drawn_ = true;
    stage_ = stage;
  }

  void finish() {
    if (drawn_) std::fputs("\n", stderr);
    drawn_ = false;
  }

 private:
  bool tty_;
  bool drawn_ = false;
  bool completed_ = false;  // the completion line of stage_ was printed
  std::string stage_;
};

int cmd_load(const Context& ctx) {
  const Args& a = ctx.args;
  expect_positional(a, 1, "one model path");
  LoadOptions o;
  o.id = a.get("--id").value_or("");
  o.context_size = a.u32("--ctx", 0);
  o.parallel = a.u32("--parallel", 0);
  o.threads = a.u32("--threads", 0);
  o.backend = a.get("--backend").value_or("");
  o.batch_tokens = a.u32("--batch", 0);
  o.pad_step = a.u32("--pad-step", 0);
  o.max_queue = a.u32("--max-queue", 0);
  o.cache_tokens = a.u32("--cache-tokens", 0);
  o.chat_template = a.get("--chat-template").value_or("");
  if (auto k = a.get("--keep-alive")) {
    char* end = nullptr;
    o.keep_alive_s = std::strtod(k->c_str(), &end);
    if (end == k->c_str() || *end != '\0' || !(o.keep_alive_s >= 0)) {
      throw UsageError("--keep-alive expects seconds (0: never unload), got '" + *k + "'");
    }
  }
  if (auto split = a.get("--layer-split")) o.layer_split = parse_layer_split(*split);
  if (auto backends = a.get("--stage-backends")) o.stage_backends = parse_stage_backends(*backends);
  // The daemon opens the file from its own working directory.
  std::error_code ec;
  std::filesystem::path path = std::filesystem::absolute(a.positional()[0], ec);
  if (ec) path = a.positional()[0];
  Client client = ctx.connect();
  ModelInfo m;
  {
    LoadProgressPrinter progress;
    m = client.load(path.lexically_normal().string(), o,
                    [&](std::string_view stage, uint64_t done, uint64_t total) { progress.update(stage, done, total); });
  }
  if (ctx.json) {
    print_json(to_json(m));
  } else {
    std::printf("loaded ");
    print_model(m);
  }
  return kExitOk;
}

int cmd_unload(const Context& ctx) {
  expect_positional(ctx.args, 1, "one model id");
  Client client = ctx.connect();
  client.unload(ctx.args.positional()[0]);
  if (ctx.json) {
    print_json(Json{{"unloaded", ctx.args.positional()[0]}});
  } else {
    std::printf("unloaded %s\n", ctx.args.positional()[0].c_str());
  }
  return kExitOk;
}

// When a model with a keep-alive is unloaded: "in 4m 12s", "when idle 5m" (busy), or "never".
std::string unloads(const ModelInfo& m) {
  if (m.keep_alive_s <= 0) return "never";
  if (m.unload_in_s < 0) return "after " + format_duration(m.keep_alive_s * 1000.0) + " idle";
  return "in " + format_duration(m.unload_in_s * 1000.0);
}

int cmd_list(const Context& ctx) {
  expect_positional(ctx.args, 0, "no arguments");
  Client client = ctx.connect();
  std::vector<ModelInfo> models = client.list();
  if (ctx.json) {
    Json out = Json::array();
    for (const ModelInfo& m : models) out.push_back(to_json(m));
    print_json(out);
    return kExitOk;
  }
  Table t({"ID", "STATE", "ARCH", "WEIGHTS", "CTX", "PARALLEL", "PLACEMENT", "WORKERS", "UNLOADS"});
  for (const ModelInfo& m : models) {
    t.add({m.id, state_text(m), or_dash(m.arch), format_bytes(m.weights_bytes), std::to_string(m.context_size),
           std::to_string(m.parallel), or_dash(m.placement.summary), workers_summary(m), unloads(m)});
  }
  std::fputs(t.render().c_str(), stdout);
  return kExitOk;
}

int cmd_status(const Context& ctx) {
  expect_positional(ctx.args, 0, "no arguments");
  Client client = ctx.connect();
  DaemonStatus s = client.status();
  if (ctx.json) {
    print_json(to_json(s));
    return kExitOk;
  }
  Table d({"", ""});
  d.add({"daemon", "inferd " + s.version + " (protocol " + std::to_string(s.protocol_version) + "), pid " +
                       std::to_string(s.pid) + ", up " + format_duration(static_cast<double>(s.uptime_ms))});
  d.add({"socket", s.socket_path});
  d.add({"memory", format_bytes(s.rss_bytes) + " resident"});
  d.add({"clients", std::to_string(s.connections) + " connected"});
  d.add({"requests", std::to_string(s.requests_total) + " total, " + std::to_string(s.requests_rejected) +
                         " rejected (overloaded)"});
  std::string body = d.render();
  std::fputs(body.substr(body.find('\n') + 1).c_str(), stdout);

  for (const ModelStatus& ms : s.models) {
    const ModelInfo& m = ms.info;
    std::printf("\nmodel %s  %s\n", m.id.c_str(), state_text(m).c_str());
    Table t({"", ""});
    t.add({"weights", format_bytes(m.weights_bytes) + " (" + format_bytes(m.weights_huge_page_bytes) +
                          " in 2 MiB pages)" + (m.arch.empty() ? "" : ", " + m.arch) +
                          (m.name.empty() ? "" : " (" + m.name + ")") + ", " + m.path});
    t.add({"placement", or_dash(m.placement.summary)});
    std::vector<std::vector<std::string>> plan_rows;
    add_plan_rows(m.placement, plan_rows);
    for (auto& row : plan_rows) t.add(std::move(row));
    t.add({"kv", std::to_string(ms.slots_used) + "/" + std::to_string(m.parallel) + " slots, " +
                     std::to_string(ms.kv_tokens_used) + " tokens, " + format_bytes(ms.kv_bytes) + " (ctx " +
                     std::to_string(m.context_size) + ")"});
    t.add({"cache", std::to_string(ms.cache_blocks_used) + " blocks in use, " +
                        std::to_string(ms.cache_blocks_cached) + " cached (" +
                        std::to_string(uint64_t{ms.cache_blocks_cached} * 64) + " tokens) of " +
                        std::to_string(ms.cache_blocks) + "; " + std::to_string(ms.cache_hits) + " hits, " +
                        std::to_string(ms.cache_hit_tokens) + " prompt tokens reused, " +
                        std::to_string(ms.cache_evictions) + " evicted"});
    t.add({"requests", std::to_string(ms.requests_active) + " active, " + std::to_string(ms.requests_queued) +
                           " queued, " + std::to_string(ms.requests_done) + " done, " +
                           std::to_string(ms.requests_failed) + " failed, " + std::to_string(ms.replays) +
                           " replays"});
    t.add({"tokens", std::to_string(ms.prompt_tokens) + " prompt, " + std::to_string(ms.generated_tokens) +
                         " generated, " + format_double(ms.decode_tokens_per_second, 1) + " tok/s decode"});
    if (ms.step_compute_us > 0) {
      t.add({"steps", format_double(ms.step_compute_us / 1000.0, 2) + " ms in the workers, " +
                          format_double(ms.step_overhead_us, 0) + " us outside (rings, wake-ups, scheduling)"});
    }
    body = t.render("  ");
    std::fputs(body.substr(body.find('\n') + 1).c_str(), stdout);
    std::printf("  workers\n");
    Table w({"#", "BACKEND", "PID", "STATE", "RSS", "SHARED", "UPTIME", "RESTARTS", "LAST RESTART", "DEVICE"});
    for (const WorkerInfo& wi : m.workers) {
      w.add({std::to_string(wi.index), wi.backend, std::to_string(wi.pid), wi.state, format_bytes(wi.rss_bytes),
             format_bytes(wi.shared_bytes), format_duration(static_cast<double>(wi.uptime_ms)),
             std::to_string(wi.restarts), wi.restarts > 0 ? format_duration(wi.last_restart_ms) : "-", wi.device});
    }
    std::fputs(w.render("    ").c_str(), stdout);
  }
  return kExitOk;
}

Sampling sampling_from(const Args& a) {
  Sampling s;
  s.temperature = a.f32("--temp", s.temperature);
  s.top_k = a.i32("--top-k", s.top_k);
  s.top_p = a.f32("--top-p", s.top_p);
  s.min_p = a.f32("--min-p", s.min_p);
  s.repeat_penalty = a.f32("--repeat-penalty", s.repeat_penalty);
  s.seed = a.u64("--seed", s.seed);
  return s;
}

// Runs one generation, streaming its text to stdout if `stream`; appends to `text` and `tokens`.
GenerateResult stream_generation(Client& client, const GenerateRequest& req, bool stream, std::string& text,
                                 std::vector<int32_t>& tokens) {
  return client.generate(req, [&](const TokenBatch& b) {
    text += b.text;
    tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
    if (stream) {
      std::fwrite(b.text.data(), 1, b.text.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
}

// The stats line goes to stderr; when stdout is a terminal or the same file as stderr (2>&1), the text
// is ended with a newline first so the two do not run together. Otherwise stdout keeps exactly the text.
bool ends_line_for_stats() {
  if (::isatty(STDOUT_FILENO) == 1) return true;
  struct stat out {}, err {};
  return ::fstat(STDOUT_FILENO, &out) == 0 && ::fstat(STDERR_FILENO, &err) == 0 && out.st_dev == err.st_dev &&
         out.st_ino == err.st_ino;
}

// `received` counts the tokens that reached the client (all the daemon reports for a cancelled run).
std::string stats_line(const GenerateResult& r, size_t received) {
  if (r.finish_reason == FinishReason::kCancelled) {
    return "[cancelled after " + std::to_string(received) + " generated tokens]";
  }
  std::string s = "[" + std::to_string(r.prompt_tokens) + " prompt tokens";
  if (r.cached_tokens > 0) s += " (" + std::to_string(r.cached_tokens) + " cached)";
  s += " in " + format_duration(r.prompt_ms) + ", " + std::to_string(r.generated_tokens) + " generated";
  if (r.generated_tokens > 1 && r.generate_ms > 0) {
    s += " at " + format_double((r.generated_tokens - 1) * 1000.0 / r.generate_ms, 1) + " tok/s";
  }
  s += ", first token after " + format_duration(r.time_to_first_token_ms);
  if (r.queue_ms >= 1) s += " (" + format_duration(r.queue_ms) + " queued)";
  s += ", " + std::string(to_string(r.finish_reason)) + ", seed " + std::to_string(r.seed);
  if (r.replays > 0) s += ", replayed " + std::to_string(r.replays) + "x";
  return s + "]";
}

int cmd_generate(const Context& ctx) {
  const Args& a = ctx.args;
  expect_positional(a, 0, "no arguments (the prompt goes in -p or on stdin)");
  GenerateRequest req;
  req.sampling = sampling_from(a);
  req.max_tokens = a.u32("--max-tokens", req.max_tokens);
  req.stop = a.all("--stop");
  req.ignore_eog = a.has("--ignore-eog");
  req.cache_prompt = !a.has("--no-cache-prompt");
  if (a.has("--stream-interval")) {
    req.stream_interval_ms = static_cast<int32_t>(std::min<uint32_t>(a.u32("--stream-interval", 0), INT32_MAX));
  }
  std::string prompt;
  if (auto p = a.get("--prompt")) {
    prompt = *p;
  } else {
    if (::isatty(STDIN_FILENO) == 1) std::fprintf(stderr, "reading the prompt from stdin (end with ^D)\n");
    prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  if (a.has("--chat")) {
    req.messages = {{"user", prompt}};
  } else {
    req.prompt = prompt;
  }
  Client client = ctx.connect();
  req.model = resolve_model(client, a);
  cancel_generation_on_sigint(client);

  std::string text;
  std::vector<int32_t> tokens;
  GenerateResult r = stream_generation(client, req, !ctx.json, text, tokens);
  if (ctx.json) {
    Json result = to_json(r);
    if (r.finish_reason == FinishReason::kCancelled) {
      // The daemon sent no result for a dropped call; only what reached the client is known.
      result = Json{{"finish_reason", finish_name(r.finish_reason)}, {"generated_tokens", tokens.size()}};
    }
    print_json(Json{{"model", req.model}, {"text", text}, {"tokens", tokens}, {"result", result}});
  } else {
    if (ends_line_for_stats() && (text.empty() || text.back() != '\n')) std::fputs("\n", stdout);
    std::fflush(stdout);
    if (!a.has("--quiet")) std::fprintf(stderr, "%s\n", stats_line(r, tokens.size()).c_str());
  }
  return r.finish_reason == FinishReason::kCancelled ? kExitInterrupted : kExitOk;
}

int cmd_chat(const Context& ctx) {
  const Args& a = ctx.args;
  expect_positional(a, 0, "no arguments");
  if (ctx.json) throw UsageError("chat has no --json output; use generate --json --chat");
  Client client = ctx.connect();
  GenerateRequest req;
  req.model = resolve_model(client, a);
  req.sampling = sampling_from(a);
  req.max_tokens = a.u32("--max-tokens", 0);
  req.stop = a.all("--stop");
  if (auto system = a.get("--system")) req.messages.push_back({"system", *system});
  cancel_generation_on_sigint(client);

  const bool tty = ::isatty(STDIN_FILENO) == 1;
  if (tty) std::fprintf(stderr, "chatting with %s; ^C stops an answer, ^D or /exit ends\n", req.model.c_str());
  for (;;) {
    if (tty) {
      std::fputs(">>> ", stdout);
      std::fflush(stdout);
    }
    std::string line;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted) {
        std::fputs("\n", stdout);
        return kExitInterrupted;
      }
      if (tty) std::fputs("\n", stdout);
      return kExitOk;
    }
    if (line == "/exit") return kExitOk;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    req.messages.push_back({"user", line});
    std::string answer;
    std::vector<int32_t> tokens;
    GenerateResult r = stream_generation(client, req, true, answer, tokens);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (r.finish_reason == FinishReason::kCancelled) {
      g_interrupted = 0;
      if (tty) std::fprintf(stderr, "[answer stopped]\n");
    } else if (a.has("--verbose")) {
      std::fprintf(stderr, "%s\n", stats_line(r, tokens.size()).c_str());
    }
    // What was said stays in the history, stopped or not.
    req.messages.push_back({"assistant", answer});
  }
}

// One stream's measurements, times in ms from the common start.
struct StreamRun {
  std::optional<Error> error;
  double start_ms = 0, end_ms = 0, first_batch_ms = -1;
  uint32_t generated = 0;
  std::vector<double> batch_gaps_ms;  // between consecutive batch arrivals
  uint32_t batches = 0;
};

int cmd_bench(const Context& ctx) {
  const Args& a = ctx.args;
  expect_positional(a, 0, "no arguments");
  const std::vector<uint32_t> streams = parse_stream_counts(a.get("--streams").value_or("1,4,16"));
  const uint32_t max_tokens = a.u32("--max-tokens", 128);
  const uint32_t prompt_tokens = a.u32("--prompt-tokens", 64);
  if (max_tokens == 0) throw UsageError("-n must be at least 1");
  if (prompt_tokens == 0) throw UsageError("--prompt-tokens must be at least 1");

  Client client = ctx.connect("inferctl-bench");
  const std::string model = resolve_model(client, a);
  // A fixed prompt of exactly prompt_tokens tokens: a paragraph repeated, tokenized once.
  const std::string paragraph =
      "The quick brown fox jumps over the lazy dog while the early morning light spreads across the quiet "
      "valley, and the farmers begin their long day of work in the fields near the old stone bridge. ";
  std::string source = paragraph;
  std::vector<int32_t> prompt = client.tokenize(model, source);
  while (prompt.size() < prompt_tokens) {
    source += paragraph;
    prompt = client.tokenize(model, source);
  }
  prompt.resize(prompt_tokens);

  GenerateRequest base;
  base.model = model;
  base.tokens = prompt;
  base.sampling.temperature = 0;  // greedy
  base.max_tokens = max_tokens;
  base.ignore_eog = true;  // every stream generates exactly max_tokens
  {
    GenerateRequest warm = base;  // first-use costs (page faults, lazy init) stay out of the numbers
    warm.max_tokens = 2;
    client.generate(warm, [](const TokenBatch&) { return true; });
  }

  Json runs = Json::array();
  Table table({"STREAMS", "TOK/S", "TTFT P50", "TTFT P99", "BATCH GAP P50", "BATCH GAP P99", "TOK/BATCH"});
  if (!ctx.json) {
    std::printf("model %s, %u prompt tokens, %u generated tokens per stream, greedy, fixed seeds\n", model.c_str(),
                prompt_tokens, max_tokens);
    std::printf("TOK/S: tokens generated by all streams / wall time from the first request to the last reply.\n"
                "TTFT: request sent to first batch received. BATCH GAP: time between consecutive batch arrivals "
                "at the client;\na batch holds every token ready when the previous one was acknowledged, so this "
                "is not a per-token latency (TOK/BATCH is the mean batch size).\n\n");
  }
  for (uint32_t n : streams) {
    std::vector<StreamRun> results(n);
    std::latch connected(n);
    const Clock::time_point origin = Clock::now();
    auto ms_since = [origin](Clock::time_point t) {
      return std::chrono::duration<double, std::milli>(t - origin).count();
    };
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        StreamRun& run = results[i];
        std::optional<Client> c;
        try {
          c.emplace(ctx.socket, "inferctl-bench");
        } catch (const Error& e) {
          run.error = e;
        }
        connected.arrive_and_wait();  // every stream starts together, connections made
        if (!c) return;
        GenerateRequest req = base;
        req.sampling.seed = 1000 + i;
        Clock::time_point last = Clock::now();
        run.start_ms = ms_since(last);
        try {
          GenerateResult r = c->generate(req, [&](const TokenBatch& b) {
            const Clock::time_point now = Clock::now();
            if (run.batches == 0) {
              run.first_batch_ms = ms_since(now) - run.start_ms;
            } else {
              run.batch_gaps_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
            }
            last = now;
            ++run.batches;
            return true;
          });
          run.generated = r.generated_tokens;
        } catch (const Error& e) {
          run.error = e;
        }
        run.end_ms = ms_since(Clock::now());
      });
    }
    for (std::thread& t : threads) t.join();

    double start = 1e300, end = 0;
    uint64_t generated = 0, batches = 0;
    std::vector<double> ttft, gaps;
    for (const StreamRun& r : results) {
      if (r.error) throw *r.error;
      start = std::min(start, r.start_ms);
      end = std::max(end, r.end_ms);
      generated += r.generated;
      batches += r.batches;
      if (r.first_batch_ms >= 0) ttft.push_back(r.first_batch_ms);
      gaps.insert(gaps.end(), r.batch_gaps_ms.begin(), r.batch_gaps_ms.end());
    }
    const double seconds = (end - start) / 1000;
    const double tps = seconds > 0 ? static_cast<double>(generated) / seconds : 0;
    const double per_batch = batches > 0 ? static_cast<double>(generated) / static_cast<double>(batches) : 0;
    runs.push_back({{"streams", n},
                    {"generated_tokens", generated},
                    {"seconds", seconds},
                    {"tokens_per_second", tps},
                    {"ttft_ms", {{"p50", percentile(ttft, 50)}, {"p99", percentile(ttft, 99)}}},
                    {"batch_gap_ms", {{"p50", percentile(gaps, 50)}, {"p99", percentile(gaps, 99)}}},
                    {"batches", batches},
                    {"tokens_per_batch", per_batch}});
    if (!ctx.json) {
      auto ms = [](double v) { return format_double(v, 1) + " ms"; };
      table.add({std::to_string(n), format_double(tps, 1), ms(percentile(ttft, 50)), ms(percentile(ttft, 99)),
                 ms(percentile(gaps, 50)), ms(percentile(gaps, 99)), format_double(per_batch, 2)});
    }
  }
  if (ctx.json) {
    print_json(Json{{"model", model},
                    {"prompt_tokens", prompt_tokens},
                    {"max_tokens", max_tokens},
                    {"sampling", "greedy"},
                    {"latency_note", "batch_gap_ms is the time between batch arrivals; a batch may hold several "
                                     "tokens, so it is not a per-token latency"},
                    {"runs", runs}});
  } else {
    std::fputs(table.render().c_str(), stdout);
  }
  return kExitOk;
}

// ------------------------------------------------------------------------------------------------
// The command table and help

struct Command {
  std::string name;
  std::string args;
  std::string summary;
  std::vector<OptionSpec> options;
  int (*run)(const Context&);
};

std::vector<OptionSpec> global_options() {
  return {{{"--socket"}, "PATH", "the daemon's socket (default here: " + default_socket_path() + "; $INFERD_SOCKET overrides)"},
          {{"--json"}, "", "machine-readable output"},
          {{"-h", "--help"}, "", "show help"}};
}

std::vector<OptionSpec> sampling_options() {
  return {{{"--temp"}, "T", "temperature; 0 = greedy (default 0.8)"},
          {{"--top-k"}, "K", "top-k; <= 0 disables (default 40)"},
          {{"--top-p"}, "P", "top-p (default 0.95)"},
          {{"--min-p"}, "P", "min-p (default 0.05)"},
          {{"--repeat-penalty"}, "R", "repeat penalty (default 1.0)"},
          {{"--seed"}, "S", "sampling seed (default: chosen by the daemon, printed in the stats)"},
          {{"--stop"}, "STR", "stop before this string; repeatable"}};
}

std::vector<Command> commands() {
  std::vector<Command> c;
  c.push_back({"load", "PATH", "load a GGUF model (progress on stderr)",
               {{{"--id"}, "ID", "model id (default: the file name without .gguf)"},
                {{"--ctx"}, "N", "context size per sequence (default: min(training context, 4096))"},
                {{"--parallel"}, "N", "sequences in flight (default 4)"},
                {{"--threads"}, "N", "compute threads per CPU worker"},
                {{"--backend"}, "B", "cpu (default), cuda, opencl, opencl:N"},
                {{"--batch"}, "N", "most tokens in one forward pass (default 512)"},
                {{"--layer-split"}, "LIST", "pipeline over several workers: first layer of each worker after the "
                                            "first, e.g. 15 (default: one worker)"},
                {{"--stage-backends"}, "LIST", "the backend of each worker of --layer-split, e.g. opencl,cpu: "
                                               "the first layers on the GPU, the rest on the CPU (default: "
                                               "--backend for all)"},
                {{"--pad-step"}, "N", "decode shapes padded to multiples of N (default 64)"},
                {{"--max-queue"}, "N", "requests waiting for a slot before OVERLOADED (default 64)"},
                {{"--keep-alive"}, "S", "unload after S seconds without a request (default 0: never)"},
                {{"--cache-tokens"}, "N", "KV positions kept for cached prompt prefixes beyond parallel x ctx "
                                          "(default 0: the room the slots do not use)"},
                {{"--chat-template"}, "NAME", "a built-in chat format instead of the file's template: chatml, "
                                              "llama3, llama2, zephyr, phi3, gemma"}},
               cmd_load});
  c.push_back({"unload", "ID", "unload a model", {}, cmd_unload});
  c.push_back({"ps", "", "list loaded models (same as list)", {}, cmd_list});
  c.push_back({"list", "", "list loaded models", {}, cmd_list});
  c.push_back({"status", "", "daemon, models, KV cache, requests and workers", {}, cmd_status});
  std::vector<OptionSpec> gen = {{{"-m", "--model"}, "MODEL", "model id (default: the only loaded model)"},
                                 {{"-p", "--prompt"}, "PROMPT", "the prompt (default: read stdin)"},
                                 {{"-n", "--max-tokens"}, "N", "most tokens to generate; 0 = no limit (default 256)"},
                                 {{"--chat"}, "", "send the prompt as one user message (chat template)"},
                                 {{"--ignore-eog"}, "", "keep generating past end-of-generation tokens"},
                                 {{"--no-cache-prompt"}, "", "compute the whole prompt, not reusing a cached prefix"},
                                 {{"--stream-interval"}, "MS", "after the first tokens, at most one batch per MS ms; 0 = each token at once (default: the daemon's, 20)"},
                                 {{"-q", "--quiet"}, "", "no stats line on stderr"}};
  for (OptionSpec& o : sampling_options()) gen.push_back(o);
  c.push_back({"generate", "", "stream a completion to stdout (^C cancels, exit 130)", gen, cmd_generate});
  std::vector<OptionSpec> chat = {{{"-m", "--model"}, "MODEL", "model id (default: the only loaded model)"},
                                  {{"--system"}, "TEXT", "system message"},
                                  {{"-n", "--max-tokens"}, "N", "most tokens per answer; 0 = no limit (default 0)"},
                                  {{"-v", "--verbose"}, "", "stats line after each answer"}};
  for (OptionSpec& o : sampling_options()) chat.push_back(o);
  c.push_back({"chat", "", "interactive chat on stdin (^C stops an answer; ^D or /exit ends)", chat, cmd_chat});
  c.push_back({"bench", "", "throughput and latency with concurrent streams (greedy, fixed seeds)",
               {{{"-m", "--model"}, "MODEL", "model id (default: the only loaded model)"},
                {{"--streams"}, "LIST", "comma-separated concurrent stream counts (default 1,4,16)"},
                {{"-n", "--max-tokens"}, "N", "tokens generated per stream (default 128)"},
                {{"--prompt-tokens"}, "N", "prompt length in tokens (default 64)"}},
               cmd_bench});
  return c;
}

std::string options_help(const std::vector<OptionSpec>& options) {
  std::string out;
  for (const OptionSpec& o : options) {
    std::string names;
    for (const std::string& n : o.names) names += (names.empty() ? "" : ", ") + n;
    if (!o.metavar.empty()) names += " " + o.metavar;
    char line[512];
    std::snprintf(line, sizeof(line), "  %-24s %s\n", names.c_str(), o.help.c_str());
    out += line;
  }
  return out;
}

std::string main_help() {
  std::string out = "usage: inferctl [--socket PATH] [--json] COMMAND [options]\n"
                    "Control and use a running inferd daemon.\n\ncommands:\n";
  for (const Command& c : commands()) {
    char line[512];
    std::snprintf(line, sizeof(line), "  %-10s %-6s %s\n", c.name.c_str(), c.args.c_str(), c.summary.c_str());
    out += line;
  }
  out += "\nglobal options:\n" + options_help(global_options());
  out += "\n`inferctl COMMAND --help` lists a command's options.\n"
         "\nexit status:\n"
         "  0    ok\n"
         "  1    the daemon refused the request (unknown model, bad file, invalid value, ...)\n"
         "  2    usage error\n"
         "  3    cannot connect to the daemon\n"
         "  4    the daemon is overloaded (queue full): retry later\n"
         "  5    disconnected: the connection or the worker running the request died\n"
         "  130  interrupted (^C during generate cancels the generation)\n";
  return out;
}

std::string command_help(const Command& c) {
  return "usage: inferctl " + c.name + (c.args.empty() ? "" : " " + c.args) + " [options]\n" + c.summary +
         "\n" + (c.options.empty() ? "" : "\noptions:\n" + options_help(c.options)) + "\nglobal options:\n" +
         options_help(global_options());
}

int run(int argc, char** argv) {
  std::vector<std::string> raw(argv + 1, argv + argc);
  // The command is the first argument that is not a global option (or its value).
  std::optional<Command> command;
  std::vector<std::string> rest;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (!command && (raw[i] == "--socket")) {
      rest.push_back(raw[i]);
      if (i + 1 < raw.size()) rest.push_back(raw[++i]);
      continue;
    }
    if (!command && !raw[i].empty() && raw[i][0] != '-') {
      for (const Command& c : commands()) {
        if (c.name == raw[i]) command = c;
      }
      if (!command) throw UsageError("unknown command '" + raw[i] + "' (see inferctl --help)");
      continue;
    }
    rest.push_back(raw[i]);
  }
  if (!command) {
    Args args(global_options(), rest);
    if (args.has("--help")) {
      std::fputs(main_help().c_str(), stdout);
      return kExitOk;
    }
    std::fputs(main_help().c_str(), stderr);
    return kExitUsage;
  }
  std::vector<OptionSpec> specs = command->options;
  for (const OptionSpec& o : global_options()) specs.push_back(o);
  Args args = [&] {
    try {
      return Args(specs, rest);
    } catch (const UsageError& e) {
      throw UsageError(std::string(e.what()) + " (see inferctl " + command->name + " --help)");
    }
  }();
  if (args.has("--help")) {
    std::fputs(command_help(*command).c_str(), stdout);
    return kExitOk;
  }
  Context ctx{args, args.get("--socket").value_or(default_socket_path()), args.has("--json")};
  return command->run(ctx);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "inferctl: %s\n", e.what());
    return kExitUsage;
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "inferctl: %s\n", e.what());
    return exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "inferctl: %s\n", e.what());
    return kExitRefused;
  }
}
