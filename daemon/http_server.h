// daemon/http_server.h — OpenAI's HTTP API (openai.h) in front of the supervisor, on KJ HTTP
// (kj/compat/http.h) on the same event loop as the Cap'n Proto server.
//
// Listeners: a unix socket next to the RPC socket (http-socket; mode 0660, so the socket's permissions
// decide who may connect, as for the RPC socket) and, when configured, a TCP address (http-listen),
// where every request must carry "Authorization: Bearer KEY" with a key from the keys file (http-keys,
// one key per line, readable by its owner only). A TCP listener without keys does not start unless
// http-no-auth is set.
//
// Endpoints: GET /health, GET /metrics (Prometheus's text format, metrics.h), GET /v1/models,
// POST /v1/chat/completions, POST /v1/completions (streamed as server-sent events when "stream": true),
// POST /v1/embeddings. Like the RPC server it is a translator only: a generation is the supervisor's
// GenerationStream. A client that disconnects cancels its generation at the next step, streamed or not:
// each request watches its connection (a duplicate of the socket, polled for the peer's end) while it
// waits, so a closed connection is noticed before any answer is written. (A client that half-closes
// its sending side after the request is taken for gone, as llama-server takes it.) Bodies are limited (a text of max-text-bytes
// plus JSON's overhead: 413 past it), a body must arrive within 30 s, headers within KJ's 15 s, and one
// peer (a uid on the unix socket, an address on TCP) may hold http-connections-per-peer connections.
//
// Thread safety: construct and use on the thread that runs the KJ event loop.
#pragma once

#include <kj/async-io.h>
#include <kj/async-unix.h>

#include <memory>
#include <string>
#include <vector>

#include "supervisor.h"

namespace inferd::daemon {

class HttpServer {
 public:
  // `keys`: the bearer keys a request on a TCP listener must present (empty: none required).
  // `events`: the loop's event port, to watch connections for a client that has gone.
  HttpServer(Supervisor& supervisor, kj::Timer& timer, kj::UnixEventPort& events, std::vector<std::string> keys);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves connections from `listener` until the returned promise is dropped. `tcp`: requests there need
  // a key (when keys are set).
  kj::Promise<void> listen(kj::Own<kj::ConnectionReceiver> listener, bool tcp);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The keys of a keys file: one per line, blank lines and '#' comments skipped. The file must be a
// regular file that only its owner can read or write (mode 0600 or stricter), else kFailed saying so;
// an empty key list is kInvalidArgument.
Result<std::vector<std::string>> read_http_keys(const std::string& path);

}  // namespace inferd::daemon
