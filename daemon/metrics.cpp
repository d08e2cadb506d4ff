#include "metrics.h"
// GCC 12 reports std::string concatenations of literals as overlapping memcpy (-Wrestrict, GCC bug
// 105329), a false positive.
#pragma GCC diagnostic ignored "-Wrestrict"

#include <cstdio>
#include <string_view>

namespace inferd::daemon {
namespace {

// A label value: backslash, double quote and newline escaped.
std::string label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

class Writer {
 public:
  // A metric family's HELP and TYPE lines, once.
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP " + std::string(name) + " " + std::string(help) + "\n";
    out_ += "# TYPE " + std::string(name) + " " + std::string(type) + "\n";
  }
  void sample(std::string_view name, std::string_view labels, double v) {
    out_ += std::string(name);
    if (!labels.empty()) out_ += "{" + std::string(labels) + "}";
    out_ += " " + number(v) + "\n";
  }
  void histogram(std::string_view name, const std::string& labels, const Histogram& h) {
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += h.counts[i];
      sample(std::string(name) + "_bucket", labels + ",le=\"" + number(h.bounds[i]) + "\"", static_cast<double>(cumulative));
    }
    sample(std::string(name) + "_bucket", labels + ",le=\"+Inf\"", static_cast<double>(h.count));
    sample(std::string(name) + "_sum", labels, h.sum);
    sample(std::string(name) + "_count", labels, static_cast<double>(h.count));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

const char* state_name(ModelState s) {
  switch (s) {
    case ModelState::kLoading: return "loading";
    case ModelState::kReady: return "ready";
    case ModelState::kRecovering: return "recovering";
    case ModelState::kFailed: return "failed";
  }
  return "failed";
}

}  // namespace

std::string prometheus_metrics(const DaemonStatusData& st) {
  Writer w;
  w.family("inferd_uptime_seconds", "gauge", "Seconds since the daemon started.");
  w.sample("inferd_uptime_seconds", "", static_cast<double>(st.uptime_ms) / 1e3);
  w.family("inferd_rpc_connections", "gauge", "Open Cap'n Proto connections.");
  w.sample("inferd_rpc_connections", "", st.connections);
  w.family("inferd_generate_requests_total", "counter", "Generation requests received, all models.");
  w.sample("inferd_generate_requests_total", "", static_cast<double>(st.requests_total));
  w.family("inferd_generate_requests_rejected_total", "counter", "Generation requests refused as OVERLOADED.");
  w.sample("inferd_generate_requests_rejected_total", "", static_cast<double>(st.requests_rejected));
  w.family("inferd_resident_bytes", "gauge", "Resident memory of the supervisor process.");
  w.sample("inferd_resident_bytes", "", static_cast<double>(st.rss_bytes));

  auto per_model = [&](std::string_view name, std::string_view type, std::string_view help, auto value) {
    w.family(name, type, help);
    for (const ModelStatusData& m : st.models) w.sample(name, "model=\"" + label(m.info.id) + "\"", value(m));
  };
  w.family("inferd_model_state", "gauge", "1 for the model's current state.");
  for (const ModelStatusData& m : st.models) {
    for (ModelState s : {ModelState::kLoading, ModelState::kReady, ModelState::kRecovering, ModelState::kFailed}) {
      w.sample("inferd_model_state", "model=\"" + label(m.info.id) + "\",state=\"" + state_name(s) + "\"",
               m.info.state == s ? 1 : 0);
    }
  }
  w.family("inferd_requests_total", "counter", "Finished generation requests by outcome.");
  for (const ModelStatusData& m : st.models) {
    const std::string l = "model=\"" + label(m.info.id) + "\"";
    w.sample("inferd_requests_total", l + ",outcome=\"completed\"",
             static_cast<double>(m.requests_done - m.requests_cancelled));
    w.sample("inferd_requests_total", l + ",outcome=\"cancelled\"", static_cast<double>(m.requests_cancelled));
    w.sample("inferd_requests_total", l + ",outcome=\"failed\"", static_cast<double>(m.requests_failed));
  }
  per_model("inferd_requests_active", "gauge", "Requests holding a sequence slot.",
            [](const ModelStatusData& m) { return static_cast<double>(m.requests_active); });
  per_model("inferd_requests_queued", "gauge", "Requests waiting for a slot.",
            [](const ModelStatusData& m) { return static_cast<double>(m.requests_queued); });
  per_model("inferd_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
            [](const ModelStatusData& m) { return static_cast<double>(m.prompt_tokens); });
  per_model("inferd_generated_tokens_total", "counter", "Generated tokens.",
            [](const ModelStatusData& m) { return static_cast<double>(m.generated_tokens); });
  per_model("inferd_replays_total", "counter", "Requests replayed on a restarted worker.",
            [](const ModelStatusData& m) { return static_cast<double>(m.replays); });
  per_model("inferd_kv_slots_used", "gauge", "KV cache sequence slots in use.",
            [](const ModelStatusData& m) { return static_cast<double>(m.slots_used); });
  per_model("inferd_kv_slots", "gauge", "KV cache sequence slots (the model's parallel).",
            [](const ModelStatusData& m) { return static_cast<double>(m.info.parallel); });
  per_model("inferd_kv_tokens_used", "gauge", "Tokens held in the KV cache.",
            [](const ModelStatusData& m) { return static_cast<double>(m.kv_tokens_used); });
  per_model("inferd_kv_bytes", "gauge", "Bytes of KV cache allocated by the model's workers.",
            [](const ModelStatusData& m) { return static_cast<double>(m.kv_bytes); });
  per_model("inferd_weights_bytes", "gauge", "Bytes of the model's shared weights segment.",
            [](const ModelStatusData& m) { return static_cast<double>(m.info.weights_bytes); });
  per_model("inferd_load_seconds", "gauge", "How long the model took to load.",
            [](const ModelStatusData& m) { return m.info.load_ms / 1e3; });
  per_model("inferd_decode_tokens_per_second", "gauge", "Recent decode rate.",
            [](const ModelStatusData& m) { return m.decode_tokens_per_second; });
  per_model("inferd_prefix_cache_blocks", "gauge", "KV blocks (64 positions each) in the model's pool.",
            [](const ModelStatusData& m) { return static_cast<double>(m.cache.blocks); });
  per_model("inferd_prefix_cache_blocks_used", "gauge", "KV blocks held by requests in flight.",
            [](const ModelStatusData& m) { return static_cast<double>(m.cache.blocks_used); });
  per_model("inferd_prefix_cache_blocks_cached", "gauge", "KV blocks kept for later requests' prefixes (evictable).",
            [](const ModelStatusData& m) { return static_cast<double>(m.cache.blocks_cached); });
  per_model("inferd_prefix_cache_hits_total", "counter", "Requests that found a cached prompt prefix.",
            [](const ModelStatusData& m) { return static_cast<double>(m.cache.hits); });
  per_model("inferd_prefix_cache_hit_tokens_total", "counter", "Prompt tokens taken from the prefix cache.",
            [](const ModelStatusData& m) { return static_cast<double>(m.cache.hit_tokens); });
  per_model("inferd_prefix_cache_evictions_total", "counter", "Cached KV blocks evicted to make room.",
            [](const ModelStatusData& m) { return static_cast<double>(m.cache.evictions); });
  w.family("inferd_worker_restarts_total", "counter", "Restarts of each worker process.");
  for (const ModelStatusData& m : st.models) {
    for (const WorkerInfoData& wk : m.info.workers) {
      w.sample("inferd_worker_restarts_total",
               "model=\"" + label(m.info.id) + "\",worker=\"" + std::to_string(wk.index) + "\",backend=\"" +
                   label(wk.backend) + "\"",
               wk.restarts);
    }
  }
  w.family("inferd_time_to_first_token_seconds", "histogram", "From a request's arrival to its first token.");
  for (const ModelStatusData& m : st.models) {
    w.histogram("inferd_time_to_first_token_seconds", "model=\"" + label(m.info.id) + "\"", m.ttft);
  }
  w.family("inferd_time_per_output_token_seconds", "histogram",
           "A request's mean time per generated token after the first.");
  for (const ModelStatusData& m : st.models) {
    w.histogram("inferd_time_per_output_token_seconds", "model=\"" + label(m.info.id) + "\"", m.token_latency);
  }
  return w.take();
}

}  // namespace inferd::daemon
