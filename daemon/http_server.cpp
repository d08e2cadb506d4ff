#include "http_server.h"
// kj::HttpService and kj::TaskSet::ErrorHandler are destroyed through their own Own<> disposers, not
// through base pointers, and have no virtual destructors.
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kj/compat/http.h>

#include <charconv>
#include <cstring>
#include <map>
#include <string>

#include "config.h"
#include "inferd/ipc/unique_fd.h"
#include "kj_bridge.h"
#include "metrics.h"
#include "openai.h"
#include "scheduler.h"

namespace inferd::daemon {

namespace {

constexpr auto kBodyTimeout = 30 * kj::SECONDS;

const char* reason_phrase(unsigned status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
  }
}

// Compares without an early exit, so the time taken says nothing about where a guess went wrong.
bool same_key(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;  // a key's length is no secret worth keeping
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  return diff == 0;
}

// Who is on the other end of a connection, for the per-peer limit: "uid N" on a unix socket
// (SO_PEERCRED), the address on TCP; "" when the kernel does not say.
std::string peer_of(kj::AsyncIoStream& conn) {
  KJ_IF_MAYBE(fd, conn.getFd()) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getpeername(*fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
    if (addr.ss_family == AF_UNIX) {
      struct ucred cred {};
      socklen_t clen = sizeof(cred);
      if (::getsockopt(*fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0) return "uid " + std::to_string(cred.uid);
      return "";
    }
    char host[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, host, sizeof(host));
    } else if (addr.ss_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, host, sizeof(host));
    }
    return host;
  }
  return "";
}

class ConnectionLogger final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&& e) override {
    spdlog::debug("HTTP connection ended: {}", e.getDescription().cStr());
  }
};

// A streamed generation's state, owned by its promise chain.
struct SseState {
  kj::Own<kj::AsyncOutputStream> out;
  std::shared_ptr<GenerationStream> stream;
  openai::Endpoint endpoint;
  openai::ResponseId rid;
  bool include_usage = false;
  bool logprobs = false;
  size_t text_offset = 0;  // completions' logprobs: bytes of text before the next event's tokens
  bool first = true;
  uint32_t interval_ms = 0;  // after the first event, at most one per interval (the daemon's stream-interval)
  kj::Duration stall = 60 * kj::SECONDS;  // stream-stall-timeout: a write not accepted by then ends it
};

// Watches a connection for its peer's end: a duplicate of the socket (KJ's own observer of the
// connection stays untouched), observed for readability, then peeked: end of file or an error means
// the client has gone; data (a pipelined request) means it is still there, and the watch ends
// unresolved.
struct PeerWatch {
  ipc::UniqueFd fd;
  kj::UnixEventPort::FdObserver observer;
  PeerWatch(kj::UnixEventPort& port, int dup) : fd(dup), observer(port, dup, kj::UnixEventPort::FdObserver::OBSERVE_READ) {}
};

kj::Promise<void> wait_gone(PeerWatch& w) {
  return w.observer.whenBecomesReadable().then([&w]() -> kj::Promise<void> {
    char c;
    const ssize_t n = ::recv(w.fd.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return kj::READY_NOW;
    if (n > 0) return kj::NEVER_DONE;
    return wait_gone(w);
  });
}

// Resolves when the client on `fd` has gone (never when the fd cannot be watched).
kj::Promise<void> peer_gone(kj::UnixEventPort& port, int fd) {
  if (fd < 0) return kj::NEVER_DONE;
  const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return kj::NEVER_DONE;
  auto w = kj::heap<PeerWatch>(port, dup);
  PeerWatch& ref = *w;
  return wait_gone(ref).attach(kj::mv(w));
}

// `work` unless the client goes first: then it is dropped (which cancels a generation) and the
// connection ends without an answer.
kj::Promise<void> unless_gone(kj::UnixEventPort& port, int fd, kj::Promise<void> work) {
  return work.exclusiveJoin(peer_gone(port, fd).then([]() -> kj::Promise<void> {
    return kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__, kj::str("the client closed its connection"));
  }));
}

constexpr size_t kEmbeddingWindow = 16;  // inputs of one embeddings request queued at once

}  // namespace

struct HttpServer::Impl {
  Supervisor& sup;
  kj::Timer& timer;
  kj::UnixEventPort& events;
  std::vector<std::string> keys;
  kj::HttpHeaderTable::Builder builder;
  kj::HttpHeaderId authorization = builder.add("Authorization");
  kj::Own<kj::HttpHeaderTable> table = builder.build();

  std::map<std::string, uint32_t> per_peer;  // open connections by peer_of(), over every listener
  std::map<std::string, uint64_t> refused;   // connections refused per peer (logged at 1, 10, 100, ...)
  struct Listener;

  Impl(Supervisor& s, kj::Timer& t, kj::UnixEventPort& e, std::vector<std::string> k)
      : sup(s), timer(t), events(e), keys(std::move(k)) {}

  // Accepts connections and serves each with `server`, at most http-connections-per-peer per peer; a
  // connection past that gets a 429 and is closed without being read.
  kj::Promise<void> accept_loop(Listener& l);



  // A client that does not accept what is written to it within stream-stall-timeout is cut off.
  kj::Duration stall() const { return stream_stall_timeout(sup.config()); }

  kj::Promise<void> send(kj::HttpService::Response& response, unsigned status, std::string body,
                         const char* content_type = "application/json", bool retry_after = false) {
    kj::HttpHeaders h(*table);
    h.set(kj::HttpHeaderId::CONTENT_TYPE, content_type);
    if (retry_after) h.add("Retry-After", "1");
    auto buf = kj::heap<std::string>(std::move(body));
    auto out = response.send(status, reason_phrase(status), h, static_cast<uint64_t>(buf->size()));
    auto written = timer.timeoutAfter(stall(), out->write(buf->data(), buf->size()));
    return written.attach(kj::mv(out), kj::mv(buf));
  }
  kj::Promise<void> send_error(kj::HttpService::Response& response, const openai::Error& e) {
    return send(response, e.http_status, e.body, "application/json", e.http_status == 429);
  }
  kj::Promise<void> send_status(kj::HttpService::Response& response, const Status& s) {
    return send_error(response, openai::error_for(s));
  }

  kj::Promise<void> models(kj::HttpService::Response& response) {
    Supervisor& s = sup;
    return on_supervisor<std::vector<ModelInfoData>>(sup, [&s] { return s.list(); })
        .then([this, &response](std::vector<ModelInfoData> list) {
          std::vector<std::string> ids;
          for (const ModelInfoData& m : list) ids.push_back(m.id);
          return send(response, 200, openai::models_body(ids));
        });
  }

  kj::Promise<void> metrics(kj::HttpService::Response& response) {
    Supervisor& s = sup;
    return on_supervisor<DaemonStatusData>(sup, [&s] { return s.status(); })
        .then([this, &response](DaemonStatusData st) {
          return send(response, 200, prometheus_metrics(st), "text/plain; version=0.0.4; charset=utf-8");
        });
  }

  // Reads a request body of at most the size a text of max-text-bytes needs (413 past it, 408 when it
  // does not arrive within 30 s), then hands it to `use`.
  kj::Promise<void> with_body(const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                              kj::HttpService::Response& response,
                              kj::Function<kj::Promise<void>(std::string_view)> use) {
    const uint32_t max_text = sup.config().max_text_bytes;
    // A text of max_text_bytes may double in JSON's escapes; the rest of a request is small.
    const uint64_t limit = 2 * uint64_t{max_text} + (uint64_t{64} << 10);
    KJ_IF_MAYBE(length, headers.get(kj::HttpHeaderId::CONTENT_LENGTH)) {
      uint64_t n = 0;
      const auto [ptr, ec] = std::from_chars(length->begin(), length->end(), n);
      if (ec != std::errc() || ptr != length->end() || n > limit) {
        return send_error(response, openai::error(413, "invalid_request_error",
                                                  "the request body is larger than this daemon takes (" +
                                                      std::to_string(limit) + " bytes)",
                                                  "request_too_large"));
      }
    }
    auto read = timer.timeoutAfter(kBodyTimeout, body.readAllText(limit + 1));
    return read.then(
        [this, &response, limit, use = kj::mv(use)](kj::String text) mutable -> kj::Promise<void> {
          if (text.size() > limit) {
            return send_error(response, openai::error(413, "invalid_request_error", "the request body is too large",
                                                      "request_too_large"));
          }
          return use(std::string_view(text.cStr(), text.size())).attach(kj::mv(text));
        },
        [this, &response](kj::Exception&& e) -> kj::Promise<void> {
          if (e.getType() == kj::Exception::Type::DISCONNECTED) return kj::mv(e);
          const bool timeout = std::string(e.getDescription().cStr()).find("timed out") != std::string::npos;
          return send_error(response, timeout ? openai::error(408, "invalid_request_error",
                                                              "the request body did not arrive within 30 s")
                                              : openai::error(413, "invalid_request_error",
                                                              "the request body could not be read: it is too large "
                                                              "or malformed",
                                                              "request_too_large"));
        });
  }

  kj::Promise<void> generate(openai::Endpoint endpoint, const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                             kj::HttpService::Response& response, int fd, const std::string& peer) {
    return with_body(headers, body, response, [this, endpoint, &response, fd, peer](std::string_view text) -> kj::Promise<void> {
      auto req = openai::parse_request(endpoint, text, sup.config().max_text_bytes);
      if (!req) return send_status(response, req.status());
      req->params.client = peer;
      return unless_gone(events, fd, run(std::move(req).value(), response));
    });
  }

  kj::Promise<void> embeddings(const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                               kj::HttpService::Response& response, int fd, const std::string& peer) {
    return with_body(headers, body, response, [this, &response, fd, peer](std::string_view text) -> kj::Promise<void> {
      auto req = openai::parse_embedding_request(text, sup.config().max_text_bytes);
      if (!req) return send_status(response, req.status());
      for (GenerateParams& p : req->inputs) p.client = peer;
      return unless_gone(events, fd, embed(std::move(req).value(), response));
    });
  }

  // One input's embedding: its summary, or why it failed. Dropping the promise cancels it.
  kj::Promise<Result<GenerateSummary>> embed_one(GenerateParams params) {
    auto stream = std::make_shared<GenerationStream>();
    return start_generation(sup, std::move(params), stream, [stream](Status st) -> kj::Promise<Result<GenerateSummary>> {
      if (!st) return Result<GenerateSummary>(st);
      return stream->ready(/*end_only=*/true).then([stream]() -> Result<GenerateSummary> {
        GenerationStream::Batch b = stream->take();
        INFERD_ASSERT(b.end.has_value(), "ready(true) resolved without the end");
        return std::move(*b.end);
      });
    });
  }

  struct EmbedState {
    openai::EmbeddingRequest req;
    std::vector<GenerateSummary> results;
    size_t next = 0;
  };

  // The inputs kEmbeddingWindow at a time (each window's run as one batch by the scheduler), then the
  // response; the first failure answers for the request.
  kj::Promise<void> embed(openai::EmbeddingRequest req, kj::HttpService::Response& response) {
    auto st = kj::heap<EmbedState>();
    st->req = std::move(req);
    st->results.resize(st->req.inputs.size());
    for (GenerateParams& p : st->req.inputs) p.keep_alive_s = st->req.keep_alive_s;
    EmbedState& ref = *st;
    return embed_window(ref, response).attach(kj::mv(st));
  }

  kj::Promise<void> embed_window(EmbedState& st, kj::HttpService::Response& response) {
    if (st.next == st.req.inputs.size()) {
      return send(response, 200, openai::embeddings_body(st.req.model, st.results, st.req.base64));
    }
    // At most the client's share of the queue at once (client-max-queue; half of max-queue by default).
    const DaemonConfig& cfg = sup.config();
    const size_t width = std::min<size_t>(kEmbeddingWindow, client_queue_share(cfg.client_max_queue, cfg.max_queue));
    const size_t begin = st.next, end = std::min(st.req.inputs.size(), begin + width);
    st.next = end;
    auto window = kj::heapArrayBuilder<kj::Promise<Result<GenerateSummary>>>(end - begin);
    for (size_t i = begin; i < end; ++i) window.add(embed_one(std::move(st.req.inputs[i])));
    return kj::joinPromises(window.finish())
        .then([this, &st, &response, begin](kj::Array<Result<GenerateSummary>> done) -> kj::Promise<void> {
          for (size_t i = 0; i < done.size(); ++i) {
            if (!done[i]) {
              const Status& why = done[i].status();
              return send_status(response, st.req.inputs.size() == 1
                                               ? why
                                               : Status(why.code(), "input " + std::to_string(begin + i) + ": " +
                                                                        why.message()));
            }
            st.results[begin + i] = std::move(done[i]).value();
          }
          return embed_window(st, response);
        });
  }

  kj::Promise<void> run(openai::Request req, kj::HttpService::Response& response) {
    auto stream = std::make_shared<GenerationStream>();
    const std::string model = req.params.model;
    const openai::Endpoint endpoint = req.endpoint;
    const bool streamed = req.stream, include_usage = req.include_usage, logprobs = req.params.logprobs >= 0;
    req.params.keep_alive_s = req.keep_alive_s;
    return start_generation(
        sup, std::move(req.params), stream,
        [this, stream, &response, endpoint, model, streamed, include_usage, logprobs](Status st) -> kj::Promise<void> {
          if (!st) return send_status(response, st);
          openai::ResponseId rid = openai::new_response_id(endpoint, model);
          if (!streamed) return whole(stream, endpoint, std::move(rid), logprobs, response);
          kj::HttpHeaders h(*table);
          h.set(kj::HttpHeaderId::CONTENT_TYPE, "text/event-stream");
          h.add("Cache-Control", "no-cache");
          auto state = kj::heap<SseState>();
          state->out = response.send(200, "OK", h);
          state->stream = stream;
          state->endpoint = endpoint;
          state->rid = std::move(rid);
          state->include_usage = include_usage;
          state->logprobs = logprobs;
          state->interval_ms = sup.config().stream_interval_ms;
          state->stall = stall();
          SseState& ref = *state;
          return pump(ref, timer).attach(kj::mv(state));
        });
  }

  // The whole answer once the generation ends.
  kj::Promise<void> whole(std::shared_ptr<GenerationStream> stream, openai::Endpoint endpoint, openai::ResponseId rid,
                          bool logprobs, kj::HttpService::Response& response) {
    return stream->ready(/*end_only=*/true).then([this, stream, endpoint, rid = std::move(rid), logprobs, &response]() {
      GenerationStream::Batch b = stream->take();
      INFERD_ASSERT(b.end.has_value(), "ready(true) resolved without the end");
      if (!b.end->is_ok()) return send_status(response, b.end->status());
      size_t offset = 0;
      return send(response, 200,
                  openai::response_body(endpoint, rid, b.text, b.end->value(), {logprobs, &b.logprobs, &offset}));
    });
  }

  // Server-sent events: the text as it is ready — the first batch at once, then at most one event per
  // stream-interval (the end cuts a wait short), as the RPC server paces its batches — then the finish
  // reason, the usage when asked for, and [DONE]. A failed write (the client went away) rejects the chain,
  // which cancels the sequence.
  static kj::Promise<void> pump(SseState& st, kj::Timer& timer) {
    kj::Promise<void> pace = kj::READY_NOW;
    if (!st.first && st.interval_ms > 0) {
      pace = timer.afterDelay(st.interval_ms * kj::MILLISECONDS).exclusiveJoin(st.stream->ready(/*end_only=*/true));
    }
    return pace.then([&st] { return st.stream->ready(); }).then([&st, &timer]() -> kj::Promise<void> {
      GenerationStream::Batch b = st.stream->take();
      auto data = kj::heap<std::string>();
      if (!b.text.empty() || (st.logprobs && !b.logprobs.empty()) ||
          (st.first && b.end && b.end->is_ok() && st.endpoint == openai::Endpoint::kChat)) {
        *data += openai::chunk_event(st.endpoint, st.rid, b.text, st.first, {st.logprobs, &b.logprobs, &st.text_offset});
        st.first = false;
      }
      const bool end = b.end.has_value();
      if (end) {
        if (b.end->is_ok()) {
          *data += openai::finish_event(st.endpoint, st.rid, b.end->value().reason);
          if (st.include_usage) *data += openai::usage_event(st.endpoint, st.rid, b.end->value());
        } else {
          *data += openai::error_event(b.end->status());
        }
        *data += openai::done_event();
      }
      if (data->empty()) return pump(st, timer);
      auto written = timer.timeoutAfter(st.stall, st.out->write(data->data(), data->size()))
                         .catch_([&st](kj::Exception&& e) -> kj::Promise<void> {
                           if (e.getType() == kj::Exception::Type::OVERLOADED) {  // timeoutAfter's
                             spdlog::warn("HTTP stream {}: the client has not read for {} s (stream-stall-timeout); "
                                          "cancelling it",
                                          st.rid.id, st.stall / kj::SECONDS);
                           }
                           return kj::mv(e);
                         })
                         .attach(kj::mv(data));
      if (end) return written;
      return written.then([&st, &timer] { return pump(st, timer); });
    });
  }

  // One connection's service: it knows its socket, to notice a client that goes while it waits, and
  // its peer, for fairness between clients.
  struct Service final : public kj::HttpService {
    Impl& impl;
    bool tcp;
    int fd;
    std::string peer;
    Service(Impl& i, bool t, int f, std::string p) : impl(i), tcp(t), fd(f), peer(std::move(p)) {}

    bool authorized(const kj::HttpHeaders& headers) const {
      if (!tcp || impl.keys.empty()) return true;
      KJ_IF_MAYBE(value, headers.get(impl.authorization)) {
        std::string_view v(value->cStr(), value->size());
        if (!v.starts_with("Bearer ")) return false;
        v.remove_prefix(7);
        bool ok = false;
        for (const std::string& k : impl.keys) ok = same_key(v, k) || ok;
        return ok;
      }
      return false;
    }

    kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& headers,
                              kj::AsyncInputStream& body, Response& response) override {
      std::string path(url.cStr(), url.size());
      path = path.substr(0, path.find('?'));
      if (!authorized(headers)) {
        return impl.send_error(response, openai::error(401, "invalid_request_error",
                                                       "a valid API key is required: Authorization: Bearer KEY",
                                                       "invalid_api_key"));
      }
      const bool get = method == kj::HttpMethod::GET, post = method == kj::HttpMethod::POST;
      if (path == "/health") {
        if (!get) return method_not_allowed(response, "GET");
        return impl.send(response, 200, "{\"status\":\"ok\"}");
      }
      if (path == "/metrics") {
        if (!get) return method_not_allowed(response, "GET");
        return impl.metrics(response);
      }
      if (path == "/v1/models") {
        if (!get) return method_not_allowed(response, "GET");
        return impl.models(response);
      }
      if (path == "/v1/chat/completions" || path == "/v1/completions") {
        if (!post) return method_not_allowed(response, "POST");
        return impl.generate(path == "/v1/completions" ? openai::Endpoint::kCompletions : openai::Endpoint::kChat,
                             headers, body, response, fd, peer);
      }
      if (path == "/v1/embeddings") {
        if (!post) return method_not_allowed(response, "POST");
        return impl.embeddings(headers, body, response, fd, peer);
      }
      return impl.send_error(response, openai::error(404, "invalid_request_error", "no such endpoint: " + path,
                                                     "unknown_url"));
    }

    kj::Promise<void> method_not_allowed(Response& response, const char* allowed) {
      return impl.send_error(response, openai::error(405, "invalid_request_error",
                                                     std::string("this endpoint takes ") + allowed));
    }
  };
};

// One listening socket: its HTTP server and its connections. Connections are declared last, so they end
// before the server they run on is destroyed.
struct HttpServer::Impl::Listener {
  kj::Own<kj::ConnectionReceiver> receiver;
  kj::Own<kj::HttpServer> server;
  ConnectionLogger logger;
  kj::TaskSet tasks{logger};
};

kj::Promise<void> HttpServer::Impl::accept_loop(Listener& l) {
  return l.receiver->accept().then([this, &l](kj::Own<kj::AsyncIoStream> conn) {
    std::string peer = peer_of(*conn);
    uint32_t& held = per_peer[peer];
    if (held >= sup.config().http_connections_per_peer) {
      const uint64_t n = ++refused[peer];
      if (n == 1 || n == 10 || n == 100 || n % 1000 == 0) {
        spdlog::warn("HTTP connection from {} refused: it holds {} already (http-connections-per-peer); {} refused so far",
                     peer.empty() ? std::string("an unknown peer") : peer, held, n);
      }
      const openai::Error e = openai::error(429, "rate_limit_error",
                                            "too many open connections from this client (" + std::to_string(held) + ")",
                                            "too_many_connections");
      auto reply = kj::heap<std::string>("HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                                         "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
                                         std::to_string(e.body.size()) + "\r\n\r\n" + e.body);
      auto written = conn->write(reply->data(), reply->size());
      l.tasks.add(written.attach(kj::mv(conn), kj::mv(reply)));
    } else {
      ++held;
      l.tasks.add(l.server->listenHttp(kj::mv(conn)).attach(kj::defer([this, peer] {
        auto it = per_peer.find(peer);
        if (it != per_peer.end() && --it->second == 0) per_peer.erase(it);
      })));
    }
    return accept_loop(l);
    });
}

HttpServer::HttpServer(Supervisor& supervisor, kj::Timer& timer, kj::UnixEventPort& events, std::vector<std::string> keys)
    : impl_(std::make_unique<Impl>(supervisor, timer, events, std::move(keys))) {}

HttpServer::~HttpServer() = default;

kj::Promise<void> HttpServer::listen(kj::Own<kj::ConnectionReceiver> listener, bool tcp) {
  auto l = kj::heap<Impl::Listener>();
  l->receiver = kj::mv(listener);
  kj::HttpServerSettings settings;
  settings.headerTimeout = 15 * kj::SECONDS;
  Impl& impl = *impl_;
  kj::HttpServer::HttpServiceFactory factory = [&impl, tcp](kj::AsyncIoStream& conn) -> kj::Own<kj::HttpService> {
    int fd = -1;
    KJ_IF_MAYBE(f, conn.getFd()) { fd = *f; }
    return kj::heap<Impl::Service>(impl, tcp, fd, peer_of(conn));
  };
  l->server = kj::heap<kj::HttpServer>(impl_->timer, *impl_->table, kj::mv(factory), settings);
  auto served = impl_->accept_loop(*l);
  return served.attach(kj::mv(l));
}

Result<std::vector<std::string>> read_http_keys(const std::string& path) {
  auto read = read_small_file(path, 1 << 20, /*follow_links=*/false, [&path](const struct stat& st) {
    if ((st.st_mode & 077) == 0) return Status::ok();
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", st.st_mode & 07777);
    return Status(Code::kFailed, path + " may be read or written by other users (mode " + mode + "); make it 0600");
  });
  if (!read) return Status(read.status().code(), "http-keys " + read.status().message());
  const std::string& text = read.value();
  std::vector<std::string> keys;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    keys.push_back(line.substr(start));
  }
  if (keys.empty()) return Status(Code::kInvalidArgument, "http-keys " + path + " holds no key");
  return keys;
}

}  // namespace inferd::daemon
