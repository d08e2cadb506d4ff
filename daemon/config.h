// daemon/config.h — the daemon's configuration: a `key = value` file, then command-line flags.
//
// parse_config() reads the file chosen by --config (else /etc/inferd/inferd.conf when it exists), then
// applies the flags over it, and returns a complete DaemonConfig: every default filled in, every path
// absolute. Anything wrong in the file or the flags is an error value (kInvalidArgument, messages
// "FILE:LINE: ..." or "--flag: ..."), never an abort. The format is described by usage() and by
// systemd/inferd.conf, the example installed to /etc/inferd/inferd.conf.
//
// Thread safety: parse_config() and default_socket_path() read the environment (getenv) and the
// process's working directory, so call them at start-up, before other threads could setenv/chdir.
// The returned values are plain data.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/status.h"

namespace inferd::daemon {

// The most steps a worker may hold at once: the capacity of its rings (ipc/ring.h).
inline constexpr uint32_t kMaxStepsInFlight = 4;

// The longest stream interval a request or the configuration may ask for.
inline constexpr uint32_t kMaxStreamIntervalMs = 60000;

// The file read when no --config flag is given, if it exists.
inline constexpr std::string_view kDefaultConfigPath = "/etc/inferd/inferd.conf";

// status.h has no "cancelled" kind, so a --help request is reported as a non-OK Status with this
// code, whose message is usage(). parse_config() returns no other kUnimplemented status; test with
// is_help_request(), print the message to stdout and exit 0.
inline constexpr Code kHelpRequested = Code::kUnimplemented;
bool is_help_request(const Status& status);

// One `load = ...` entry: a model the daemon loads at start. Zero numbers mean "the daemon's default"
// (as in rpc::LoadOptions).
struct ModelToLoad {
  std::string path;  // absolute
  std::string id;    // id=ID, else the file name without ".gguf" (as rpc::LoadOptions.id); unique
  uint32_t context_size = 0, parallel = 0, threads = 0;
  std::string backend = "cpu";
};

struct DaemonConfig {
  std::string socket_path;           // absolute; default_socket_path() unless set
  std::string worker_path;           // inferd-worker binary; default: next to /proc/self/exe
  std::string log_level = "info";    // trace, debug, info, warn, error, off
  // The workers' kernels::MatmulOrder, passed to them as INFERD_MATMUL_ORDER: "vec_dot" or "repacked"; empty:
  // the daemon's own environment decides.
  std::string matmul_order;
  uint32_t threads = 0;              // default worker compute threads; 0 = all CPUs
  uint32_t max_restarts = 5;         // worker restarts allowed within restart_window_s ...
  double restart_window_s = 60;      // ... before its backend is marked failed
  uint32_t default_context = 0;      // 0: min(training context, 4096)
  uint32_t default_parallel = 4;     // >= 1
  uint32_t max_queue = 64;           // >= 1: requests waiting for a slot before OVERLOADED
  // Fairness between clients (a uid on a unix socket, an address on TCP): one client holds at most this
  // many of a model's queue places (0: half of max-queue, at least 1) and KV slots (0: no cap beyond
  // the fair-share admission, which gives a free slot to the waiting client holding the fewest).
  uint32_t client_max_queue = 0;
  uint32_t client_max_slots = 0;
  uint32_t steps_in_flight = 2;      // 1..kMaxStepsInFlight: steps queued per worker (supervisor.cpp)
  uint32_t stream_interval_ms = 20;  // 0..kMaxStreamIntervalMs: a request's default streamIntervalMs
  // Largest text one request may have tokenized (a prompt, the messages of a chat, tokenize's text); the
  // RPC layer refuses messages much larger than this before reading them.
  uint32_t max_text_bytes = 4u << 20;
  // A worker that is not ready (Hello, backend made, Ready) this long after it was started is killed, like
  // a crashed one; a step a worker has not finished in step_timeout_s is a hang: the worker is killed and
  // the requests in that step fail.
  double start_timeout_s = 300;
  double step_timeout_s = 600;
  // A client that does not accept what a stream sends it (a token batch, an HTTP write) within this
  // many seconds is cut off and its generation cancelled; meanwhile its sequence is paused once its
  // backlog passes GenerationStream::kMaxBacklogBytes.
  double stream_stall_timeout_s = 60;
  // Admin (load, unload, status) is for the daemon's own uid and root, plus these uids; admin_any opens
  // it to every peer that can open the socket ("admin-uids = any").
  std::vector<uint32_t> admin_uids;
  bool admin_any = false;
  std::vector<ModelToLoad> load;     // models loaded at start, in order
  // OpenAI's HTTP API (http_server.h): a unix socket (default: next to `socket_path`, see
  // default_http_socket(); "off": none), a TCP address "HOST:PORT" (none by default) whose requests need
  // a bearer key from the `http_keys` file, unless http_no_auth.
  std::string http_socket;
  // Models requested by name (a file "<dir>/<name>[.gguf]") are loaded on first use from these
  // directories, and unloaded after keep_alive_s idle seconds (0: never).
  std::vector<std::string> model_dirs;
  double keep_alive_s = 300;
  std::string http_listen;
  std::string http_keys;
  bool http_no_auth = false;
  // Open HTTP connections one peer may hold (a uid on the unix socket, an address on TCP); past it a new
  // connection is answered 429 and closed.
  uint32_t http_connections_per_peer = 64;

  // True when Admin is open to every peer.
  bool admin_open() const { return admin_any; }
};

// $INFERD_SOCKET if set and non-empty; else $XDG_RUNTIME_DIR/inferd/inferd.sock if XDG_RUNTIME_DIR is
// set; else /run/inferd/inferd.sock when running as root; else /tmp/inferd-<uid>/inferd.sock.
std::string default_socket_path();

// A small regular file read whole: opened without blocking (a FIFO is refused, never waited on), and
// without following a final symlink unless `follow_links`; larger than `max_bytes` is refused. `check`,
// when given, sees the open file's stat before anything is read and may refuse it. kNotFound when the
// file does not exist; kInvalidArgument when it is not a regular file or too large; kFailed otherwise.
Result<std::string> read_small_file(const std::string& path, size_t max_bytes, bool follow_links = true,
                                    const std::function<Status(const struct stat&)>& check = nullptr);

// The HTTP socket next to the RPC socket: ".../inferd.sock" -> ".../inferd-http.sock" (any other name
// gets "-http" appended).
std::string default_http_socket(const std::string& socket_path);

// The inferd-worker binary in the directory of /proc/self/exe; "inferd-worker" (found through PATH by
// the caller) if /proc/self/exe cannot be read.
std::string default_worker_path();

// Parses the configuration file, then argv[1..argc) (argv[0] is the program name). Flags are
// `--key value` or `--key=value`, with the file's key names, plus `--config PATH` and `--help`/-h.
//
// Precedence: a flag replaces the file's value. `load` and `admin-uids` are lists: the flags' entries
// (every --load, the last --admin-uids) replace the file's whole list rather than adding to it.
// In the file a key other than `load` may appear once; on the command line the last flag wins.
// Relative paths in the file are relative to the file's directory; on the command line, to the
// working directory.
//
// Errors: kInvalidArgument for bad input, kNotFound when --config names a missing file, kFailed
// when the file cannot be read; kHelpRequested for --help (see above).
Result<DaemonConfig> parse_config(int argc, const char* const* argv);

// As above with another default file instead of kDefaultConfigPath; empty: no default file. For tests
// and for callers that must not read /etc.
Result<DaemonConfig> parse_config(int argc, const char* const* argv,
                                  std::string_view default_config_path);

// The --help text: every flag and file key, with its default.
std::string usage();

}  // namespace inferd::daemon
