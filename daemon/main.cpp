// inferd: the supervisor daemon. See docs/ARCHITECTURE.md.
//
// Threads: the main thread runs the KJ event loop with the Cap'n Proto server (rpc_server.h) and
// handles SIGTERM/SIGINT; the supervisor thread runs the Asio io_context that owns every model and
// worker (supervisor.h); each load copies its file on a short-lived loader thread.
#include <sched.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <kj/vector.h>

#include "config.h"
#include "http_server.h"
#include "rpc_server.h"
#include "sd_notify.h"
#include "supervisor.h"

namespace inferd::daemon {
namespace {

void setup_logging(const DaemonConfig& cfg) {
  auto logger = spdlog::stderr_color_mt("inferd");
  spdlog::set_default_logger(logger);
  // Under systemd, journald adds its own timestamps.
  if (std::getenv("JOURNAL_STREAM")) {
    spdlog::set_pattern("%l: %v");
  } else {
    spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  }
  spdlog::set_level(spdlog::level::from_str(cfg.log_level));
}

// The daemon's own threads (RPC and supervisor) are SCHED_BATCH: when they wake up (a token to stream,
// a completion to handle) they do not preempt the workers' compute threads, which synchronise at
// barriers many times per forward pass, so one preempted thread stalls them all. They run as soon as a
// core is free, which on a busy machine is within a few hundred microseconds. Workers are reset to
// SCHED_OTHER before exec (worker_process.cpp). Threads created later inherit the policy.
void use_batch_scheduling() {
  sched_param param{};
  if (::sched_setscheduler(0, SCHED_BATCH, &param) != 0) spdlog::debug("SCHED_BATCH not available");
}

int run(DaemonConfig cfg) {
  // Before any thread exists (setenv is not thread-safe); worker processes inherit the environment.
  if (!cfg.matmul_order.empty()) ::setenv("INFERD_MATMUL_ORDER", cfg.matmul_order.c_str(), 1);
  setup_logging(cfg);
  use_batch_scheduling();
  ::signal(SIGPIPE, SIG_IGN);
  // Blocked here before any thread starts, so only the KJ loop sees them (and workers unblock them).
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
  auto io = kj::setupAsyncIo();

  // The HTTP API's keys are checked before any socket is bound: a daemon that will not serve its
  // configuration never answers on any of its sockets.
  std::vector<std::string> keys;
  if (!cfg.http_keys.empty()) {
    auto k = read_http_keys(cfg.http_keys);
    if (!k) {
      spdlog::critical("{}", k.status().message());
      return 1;
    }
    keys = std::move(k).value();
  }
  if (!cfg.http_listen.empty() && keys.empty() && !cfg.http_no_auth) {
    spdlog::critical("http-listen {} needs bearer keys (http-keys = FILE, mode 0600); http-no-auth = true serves it to "
                     "anyone who can reach the address",
                     cfg.http_listen);
    return 1;
  }

  int listen_fd = -1;
  bool activated = false;
  std::vector<int> fds = systemd::listen_fds();
  if (!fds.empty()) {
    listen_fd = fds[0];
    activated = true;
    for (size_t i = 1; i < fds.size(); ++i) ::close(fds[i]);
    spdlog::info("using the socket passed by systemd (fd {})", listen_fd);
  } else {
    auto fd = listen_unix(cfg.socket_path);
    if (!fd) {
      spdlog::critical("{}", fd.status().message());
      return 1;
    }
    listen_fd = fd.value();
  }

  Supervisor sup(cfg);
  // OpenAI's HTTP API: the unix socket next to the RPC one, and a TCP address when configured. A listener
  // that was asked for and cannot be served stops the daemon: failing closed beats serving half a config.
  HttpServer http(sup, io.provider->getTimer(), io.unixEventPort, keys);
  kj::Vector<kj::Promise<void>> http_serving;
  const std::string http_path = cfg.http_socket.empty() ? default_http_socket(cfg.socket_path) : cfg.http_socket;
  if (http_path != "off") {
    auto fd = listen_unix(http_path);
    if (!fd) {
      spdlog::critical("HTTP API: {}", fd.status().message());
      return 1;
    }
    http_serving.add(http.listen(io.lowLevelProvider->wrapListenSocketFd(fd.value(), kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP),
                                 /*tcp=*/false)
                         .eagerlyEvaluate([](kj::Exception&& e) {
                           spdlog::critical("HTTP accept loop failed: {}", e.getDescription().cStr());
                         }));
    spdlog::info("OpenAI-compatible HTTP API on {}", http_path);
  }
  if (!cfg.http_listen.empty()) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] {
      auto addr = io.provider->getNetwork().parseAddress(cfg.http_listen).wait(io.waitScope);
      http_serving.add(http.listen(addr->listen(), /*tcp=*/true).eagerlyEvaluate([](kj::Exception&& ex) {
        spdlog::critical("HTTP accept loop failed: {}", ex.getDescription().cStr());
      }));
    })) {
      spdlog::critical("http-listen {}: {}", cfg.http_listen, e->getDescription().cStr());
      return 1;
    }
    spdlog::info("OpenAI-compatible HTTP API on {}{}", cfg.http_listen, keys.empty() ? " WITHOUT keys (http-no-auth)" : "");
  }

  std::atomic<int64_t> supervisor_heartbeat{0};
  std::thread sup_thread([&] { sup.run(); });
  RpcServer server(sup, *io.provider, *io.lowLevelProvider, listen_fd);
  auto serving = server.run().eagerlyEvaluate([](kj::Exception&& e) {
    spdlog::critical("accept loop failed: {}", e.getDescription().cStr());
  });
  spdlog::info("inferd {} serving {} (pid {})", INFERD_VERSION, cfg.socket_path, ::getpid());

  for (const ModelToLoad& m : cfg.load) {
    LoadSpec spec;
    spec.path = m.path;
    spec.id = m.id;
    spec.context_size = m.context_size;
    spec.parallel = m.parallel;
    spec.threads = m.threads;
    spec.backend = m.backend;
    sup.post([&sup, spec] {
      sup.load(spec, nullptr, [path = spec.path](Result<ModelInfoData> r) {
        if (!r) spdlog::error("could not load {} at start: {}", path, r.status().message());
      });
    });
  }
  systemd::notify("READY=1\nSTATUS=serving " + cfg.socket_path);

  // Watchdog: ping systemd only while the supervisor thread still answers.
  kj::Promise<void> watchdog = kj::READY_NOW;
  if (auto interval = systemd::watchdog_interval()) {
    auto half = std::chrono::duration_cast<std::chrono::milliseconds>(*interval / 2);
    auto& timer = io.provider->getTimer();
    std::function<kj::Promise<void>(int64_t)> tick = [&](int64_t seen) -> kj::Promise<void> {
      int64_t now = supervisor_heartbeat.load();
      if (now != seen || seen == 0) systemd::notify("WATCHDOG=1");
      sup.post([&] { supervisor_heartbeat.fetch_add(1); });
      return timer.afterDelay(half.count() * kj::MILLISECONDS).then([&, now] { return tick(now); });
    };
    watchdog = tick(0).eagerlyEvaluate(nullptr);
  }

  int sig = io.unixEventPort.onSignal(SIGTERM)
                .exclusiveJoin(io.unixEventPort.onSignal(SIGINT))
                .wait(io.waitScope)
                .si_signo;
  spdlog::info("signal {}: stopping", sig);
  systemd::notify("STOPPING=1");
  sup.post([&sup] { sup.stop(); });
  // Keep serving the KJ loop while the supervisor winds down, so failing streams reach their clients.
  auto stopped = kj::newPromiseAndCrossThreadFulfiller<void>();
  std::thread joiner([&] {
    sup_thread.join();
    stopped.fulfiller->fulfill();
  });
  stopped.promise.wait(io.waitScope);
  joiner.join();
  if (!activated) ::unlink(cfg.socket_path.c_str());
  if (http_path != "off") ::unlink(http_path.c_str());
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace inferd::daemon

int main(int argc, char** argv) {
  auto cfg = inferd::daemon::parse_config(argc, argv);
  if (!cfg) {
    if (inferd::daemon::is_help_request(cfg.status())) {
      std::fputs(cfg.status().message().c_str(), stdout);
      return 0;
    }
    std::fprintf(stderr, "inferd: %s\n", cfg.status().message().c_str());
    return 2;
  }
  try {
    return inferd::daemon::run(std::move(cfg).value());
  } catch (const kj::Exception& e) {
    spdlog::critical("fatal: {}", e.getDescription().cStr());
    return 1;
  }
}
