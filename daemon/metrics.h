// daemon/metrics.h — the daemon's status in Prometheus's text exposition format (version 0.0.4), for
// GET /metrics on the HTTP API: per model (label model="ID") requests by outcome, prompt and generated
// tokens, time-to-first-token and per-token latency histograms, active and queued requests, KV slots and
// tokens, worker restarts and replays, the load time and the weights; daemon-wide uptime, connections,
// requests and rejections (OVERLOADED).
// Thread safety: a pure function.
#pragma once

#include <string>

#include "supervisor.h"

namespace inferd::daemon {

std::string prometheus_metrics(const DaemonStatusData& status);

}  // namespace inferd::daemon
