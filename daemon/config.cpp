#include "config.h"

#include "inferd/backend_names.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

namespace inferd::daemon {
namespace {

// A configuration file larger than this is certainly not one (and would only waste memory).
constexpr size_t kMaxConfigBytes = 1 << 20;
// sockaddr_un::sun_path holds the path and its terminating NUL.
constexpr size_t kMaxSocketPathBytes = sizeof(sockaddr_un::sun_path) - 1;
// (uid_t)-1 means "no uid" to the kernel (e.g. chown), so it cannot be an admin.
constexpr uint32_t kMaxUid = 0xfffffffeu;

constexpr std::string_view kLogLevels[] = {"trace", "debug", "info", "warn", "error", "off"};

enum class Key {
  kSocket, kWorker, kLogLevel, kThreads, kMaxRestarts, kRestartWindow,
  kContext, kParallel, kMaxQueue, kClientMaxQueue, kClientMaxSlots, kStepsInFlight, kStreamInterval, kMaxTextBytes, kStartTimeout, kStepTimeout, kStreamStallTimeout, kAdminUids, kLoad,
  kHttpSocket, kHttpListen, kHttpKeys, kHttpNoAuth, kHttpConnectionsPerPeer, kModelDirs, kKeepAlive, kMatmulOrder,
};

struct KeyInfo {
  std::string_view name;  // file key; the flag is "--" + name
  Key key;
  std::string_view arg;   // what the value looks like, for usage()
  std::string_view help;  // one line, with the default
};

constexpr KeyInfo kKeys[] = {
    {"socket", Key::kSocket, "PATH",
     "unix socket to listen on (default: $INFERD_SOCKET, else\n"
     "                         $XDG_RUNTIME_DIR/inferd/inferd.sock, else /run/inferd/inferd.sock for\n"
     "                         root, else /tmp/inferd-UID/inferd.sock)"},
    {"worker", Key::kWorker, "PATH", "inferd-worker binary (default: next to the inferd binary)"},
    {"log-level", Key::kLogLevel, "LEVEL", "trace, debug, info, warn, error or off (default: info)"},
    {"threads", Key::kThreads, "N", "compute threads of a CPU worker; 0 = all CPUs (default: 0)"},
    {"max-restarts", Key::kMaxRestarts, "N",
     "worker restarts allowed within restart-window before the backend is\n"
     "                         marked failed (default: 5)"},
    {"restart-window", Key::kRestartWindow, "SECONDS", "see max-restarts; > 0 (default: 60)"},
    {"context", Key::kContext, "N", "tokens per sequence; 0 = min(training context, 4096) (default: 0)"},
    {"parallel", Key::kParallel, "N", "sequences in flight per model; >= 1 (default: 4)"},
    {"max-queue", Key::kMaxQueue, "N", "requests waiting for a slot before OVERLOADED; >= 1 (default: 64)"},
    {"client-max-queue", Key::kClientMaxQueue, "N",
     "queue places of a model one client (a uid, or a TCP address) may hold;\n"
     "                         0 = half of max-queue (default: 0)"},
    {"client-max-slots", Key::kClientMaxSlots, "N",
     "KV slots of a model one client may hold; 0 = no cap: a free slot goes to\n"
     "                         the waiting client that holds the fewest (default: 0)"},
    {"steps-in-flight", Key::kStepsInFlight, "N",
     "steps queued per worker, 1-4; with 2 a worker starts each decode step\n"
     "                         on the token it just sampled, without waiting for the daemon (default: 2)"},
    {"stream-interval", Key::kStreamInterval, "MS",
     "after a generation's first batch of tokens, at most one batch per MS\n"
     "                         milliseconds unless the request says otherwise; 0 = each token as soon\n"
     "                         as it is ready; at most 60000 (default: 20)"},
    {"max-text-bytes", Key::kMaxTextBytes, "N",
     "largest text a request may have tokenized (prompt, chat messages,\n"
     "                         tokenize); 1024 to 67108864 (default: 4194304)"},
    {"start-timeout", Key::kStartTimeout, "SECONDS",
     "a worker not ready this long after it starts is killed (and restarted\n"
     "                         like a crashed one); > 0 (default: 300)"},
    {"step-timeout", Key::kStepTimeout, "SECONDS",
     "a step not finished this long means the worker hangs: it is killed and\n"
     "                         the requests in that step fail; > 0 (default: 600)"},
    {"stream-stall-timeout", Key::kStreamStallTimeout, "SECONDS",
     "a client that does not accept the tokens sent to it this long is cut\n"
     "                         off and its generation cancelled; > 0 (default: 60)"},
    {"admin-uids", Key::kAdminUids, "UID,...",
     "peer uids that may use Admin besides the daemon's own and root; 'any':\n"
     "                         every peer that can open the socket (default: only the daemon's own\n"
     "                         uid and root)"},
    {"http-socket", Key::kHttpSocket, "PATH|off",
     "unix socket of the OpenAI-compatible HTTP API (default: next to the RPC\n"
     "                         socket, inferd.sock -> inferd-http.sock); off: none"},
    {"http-listen", Key::kHttpListen, "HOST:PORT",
     "also serve the HTTP API on this TCP address, e.g. 127.0.0.1:11435; every\n"
     "                         request there needs a key from http-keys (default: none)"},
    {"http-keys", Key::kHttpKeys, "PATH",
     "file of bearer keys for http-listen, one per line, mode 0600 (default: none)"},
    {"http-no-auth", Key::kHttpNoAuth, "true|false",
     "serve http-listen without keys: anyone who can reach the address may use\n"
     "                         it (default: false; without keys the listener does not start)"},
    {"http-connections-per-peer", Key::kHttpConnectionsPerPeer, "N",
     "open HTTP connections one peer (uid, or address on TCP) may hold; past it\n"
     "                         a connection is answered 429 and closed; >= 1 (default: 64)"},
    {"model-dirs", Key::kModelDirs, "DIR[:DIR...]",
     "directories of GGUF files: a request for a model that is not loaded, by\n"
     "                         a file's name (with or without .gguf), loads it (default: none)"},
    {"keep-alive", Key::kKeepAlive, "SECONDS",
     "a model loaded by name is unloaded after this long without requests;\n"
     "                         0 = never (default: 300)"},
    {"matmul-order", Key::kMatmulOrder, "vec_dot|repacked",
     "the CPU workers' matmul arithmetic: llama.cpp's vec_dot kernels, or its\n"
     "                         default: repacked Q4_0/Q4_K/IQ4_NL, tiled K-quant GEMM for the other\n"
     "                         K-quants and IQ4_XS (faster prefill; CUDA exact numerics need vec_dot)\n"
     "                         (default: $INFERD_MATMUL_ORDER, else repacked)"},
    {"load", Key::kLoad, "PATH [id=ID] [ctx=N] [parallel=N] [threads=N] [backend=cpu|cuda[:N]|opencl[:N]]",
     "\n                         load a model at start; repeatable (quote a PATH with spaces: \"...\")"},
};

const KeyInfo* find_key(std::string_view name) {
  for (const KeyInfo& info : kKeys) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

// A value quoted for an error message: control bytes escaped, long values cut.
std::string quote(std::string_view value) {
  constexpr size_t kMaxShown = 80;
  std::string out = "'";
  for (size_t i = 0; i < value.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (value.size() > kMaxShown) out += "...";
  return out + "'";
}

Status invalid(std::string message) { return Status(Code::kInvalidArgument, std::move(message)); }

std::string_view trim(std::string_view s) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Full-line comments only: a '#' inside a value is part of it (paths may contain one). Say so when
// a bad value looks like it carries a trailing comment.
std::string comment_hint(std::string_view value) {
  return value.find('#') != std::string_view::npos ? " (comments must be on their own line)" : "";
}

Result<uint32_t> parse_u32(std::string_view s, uint32_t min, uint32_t max) {
  uint64_t v = 0;
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec == std::errc::invalid_argument || ptr != end) {
    return invalid(quote(s) + " is not a whole number" + comment_hint(s));
  }
  if (ec == std::errc::result_out_of_range || v < min || v > max) {
    return invalid(quote(s) + " is out of range (" + std::to_string(min) + ".." + std::to_string(max) +
                   ")");
  }
  return static_cast<uint32_t>(v);
}

Result<double> parse_seconds(std::string_view s) {
  double v = 0;
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, v, std::chars_format::fixed);
  if (s.empty() || ec != std::errc() || ptr != end || !std::isfinite(v)) {
    return invalid(quote(s) + " is not a number of seconds" + comment_hint(s));
  }
  if (v <= 0) return invalid(quote(s) + " must be more than 0 seconds");
  return v;
}

// Where values come from: the file (relative paths against its directory) or the command line
// (against the working directory).
struct Origin {
  std::string base_dir;  // absolute
};

std::string absolute_path(std::string_view path, const Origin& origin) {
  std::filesystem::path p(path);
  if (p.is_relative()) p = std::filesystem::path(origin.base_dir) / p;
  return p.lexically_normal().string();
}

Result<std::string> current_dir() {
  std::error_code ec;
  std::filesystem::path cwd = std::filesystem::current_path(ec);
  if (ec) return Status(Code::kFailed, "cannot read the working directory: " + ec.message());
  return cwd.string();
}

// "/models/llama-3.gguf" -> "llama-3" (the rule of rpc::LoadOptions.id).
std::string default_model_id(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  constexpr std::string_view kExt = ".gguf";
  if (name.size() > kExt.size() && name.ends_with(kExt)) name.resize(name.size() - kExt.size());
  return name;
}

// `PATH [id=ID] [ctx=N] [parallel=N] [threads=N] [backend=NAME]`; PATH may be "double quoted".
Result<ModelToLoad> parse_load(std::string_view spec, const Origin& origin) {
  ModelToLoad model;
  std::string_view rest = spec;
  std::string_view path;
  if (rest.starts_with('"')) {
    const size_t close = rest.find('"', 1);
    if (close == std::string_view::npos) return invalid("unterminated quote in " + quote(spec));
    path = rest.substr(1, close - 1);
    rest.remove_prefix(close + 1);
    if (!rest.empty() && rest.front() != ' ' && rest.front() != '\t') {
      return invalid("expected a space after the quoted path in " + quote(spec));
    }
  } else {
    const size_t space = rest.find_first_of(" \t");
    path = rest.substr(0, space);
    rest.remove_prefix(space == std::string_view::npos ? rest.size() : space);
  }
  if (path.empty()) return invalid("the model path is empty");
  model.path = absolute_path(path, origin);

  bool seen[5] = {};
  while (!(rest = trim(rest)).empty()) {
    const size_t space = rest.find_first_of(" \t");
    const std::string_view option = rest.substr(0, space);
    rest.remove_prefix(space == std::string_view::npos ? rest.size() : space);
    const size_t eq = option.find('=');
    if (eq == std::string_view::npos) {
      return invalid("unexpected " + quote(option) +
                     " after the model path (options are name=value; quote a path with spaces)");
    }
    const std::string_view name = option.substr(0, eq);
    const std::string_view value = option.substr(eq + 1);
    constexpr std::string_view kNames[] = {"id", "ctx", "parallel", "threads", "backend"};
    const size_t index = static_cast<size_t>(std::find(std::begin(kNames), std::end(kNames), name) -
                                             std::begin(kNames));
    if (index == std::size(kNames)) {
      return invalid("unknown load option " + quote(name) +
                     " (expected id=, ctx=, parallel=, threads= or backend=)");
    }
    if (seen[index]) return invalid("load option " + quote(name) + " given twice");
    seen[index] = true;
    if (value.empty()) return invalid("load option " + quote(name) + " has no value");
    switch (index) {
      case 0:
        model.id = value;
        break;
      case 1:
      case 2:
      case 3: {
        Result<uint32_t> n = parse_u32(value, 0, UINT32_MAX);
        if (!n) return invalid(std::string(name) + "=: " + n.status().message());
        (index == 1 ? model.context_size : index == 2 ? model.parallel : model.threads) = *n;
        break;
      }
      default: {
        // "opencl:N" / "cuda:N" pick device N of that backend. Any family inferd knows: whether this
        // build and machine have it is checked when the model is loaded; this only catches typos.
        const auto backend = parse_backend_name(value);
        if (!backend || find_backend_family(backend->family) == nullptr) {
          return invalid("unknown backend " + quote(value) + " (expected " + backend_name_forms() + ")");
        }
        model.backend = value;
      }
    }
  }
  if (model.id.empty()) model.id = default_model_id(model.path);
  if (model.id.empty()) return invalid("cannot derive a model id from " + quote(path) + "; add id=");
  return model;
}

// Applies one key's value (already trimmed, non-empty) to `config`. Errors name the problem but not
// the key or place; the caller adds those.
Status apply(Key key, std::string_view value, const Origin& origin, DaemonConfig& config) {
  switch (key) {
    case Key::kSocket: {
      std::string path = absolute_path(value, origin);
      if (path.size() > kMaxSocketPathBytes) {
        return invalid(quote(path) + " is " + std::to_string(path.size()) +
                       " bytes long; a unix socket path holds at most " +
                       std::to_string(kMaxSocketPathBytes));
      }
      config.socket_path = std::move(path);
      return Status::ok();
    }
    case Key::kWorker:
      config.worker_path = absolute_path(value, origin);
      return Status::ok();
    case Key::kLogLevel:
      if (std::find(std::begin(kLogLevels), std::end(kLogLevels), value) == std::end(kLogLevels)) {
        return invalid("unknown level " + quote(value) +
                       " (expected trace, debug, info, warn, error or off)" + comment_hint(value));
      }
      config.log_level = value;
      return Status::ok();
    case Key::kMatmulOrder:
      if (value != "vec_dot" && value != "repacked") {
        return invalid("unknown matmul order " + quote(value) + " (expected vec_dot or repacked)" + comment_hint(value));
      }
      config.matmul_order = value;
      return Status::ok();
    case Key::kThreads:
    case Key::kMaxRestarts:
    case Key::kContext:
    case Key::kParallel:
    case Key::kMaxQueue:
    case Key::kClientMaxQueue:
    case Key::kClientMaxSlots:
    case Key::kStepsInFlight:
    case Key::kStreamInterval: {
      const uint32_t min = (key == Key::kParallel || key == Key::kMaxQueue || key == Key::kStepsInFlight) ? 1 : 0;
      const uint32_t max = key == Key::kStepsInFlight     ? kMaxStepsInFlight
                           : key == Key::kStreamInterval ? kMaxStreamIntervalMs
                                                         : UINT32_MAX;
      Result<uint32_t> n = parse_u32(value, min, max);
      if (!n) return n.status();
      uint32_t& field = key == Key::kThreads       ? config.threads
                        : key == Key::kMaxRestarts ? config.max_restarts
                        : key == Key::kContext     ? config.default_context
                        : key == Key::kParallel    ? config.default_parallel
                        : key == Key::kMaxQueue    ? config.max_queue
                        : key == Key::kClientMaxQueue ? config.client_max_queue
                        : key == Key::kClientMaxSlots ? config.client_max_slots
                        : key == Key::kStepsInFlight ? config.steps_in_flight
                                                     : config.stream_interval_ms;
      field = *n;
      return Status::ok();
    }
    case Key::kMaxTextBytes: {
      Result<uint32_t> n = parse_u32(value, 1024, 64u << 20);
      if (!n) return n.status();
      config.max_text_bytes = *n;
      return Status::ok();
    }
    case Key::kRestartWindow:
    case Key::kStartTimeout:
    case Key::kStepTimeout:
    case Key::kStreamStallTimeout: {
      Result<double> s = parse_seconds(value);
      if (!s) return s.status();
      (key == Key::kRestartWindow  ? config.restart_window_s
       : key == Key::kStartTimeout ? config.start_timeout_s
       : key == Key::kStepTimeout  ? config.step_timeout_s
                                   : config.stream_stall_timeout_s) = *s;
      return Status::ok();
    }
    case Key::kAdminUids: {
      if (trim(value) == "any") {
        config.admin_any = true;
        config.admin_uids.clear();
        return Status::ok();
      }
      std::vector<uint32_t> uids;
      std::string_view rest = value;
      while (true) {
        const size_t comma = rest.find(',');
        const std::string_view item = trim(rest.substr(0, comma));
        if (item.empty()) return invalid("empty entry in the uid list " + quote(value));
        Result<uint32_t> uid = parse_u32(item, 0, kMaxUid);
        if (!uid) return invalid("bad uid: " + uid.status().message());
        uids.push_back(*uid);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
      config.admin_uids = std::move(uids);
      config.admin_any = false;
      return Status::ok();
    }
    case Key::kHttpSocket:
      config.http_socket = value == "off" ? std::string("off") : absolute_path(value, origin);
      if (config.http_socket != "off" && config.http_socket.size() > kMaxSocketPathBytes) {
        return invalid(quote(config.http_socket) + " is too long for a unix socket path");
      }
      return Status::ok();
    case Key::kHttpListen: {
      const size_t colon = value.rfind(':');
      if (colon == std::string_view::npos || colon == 0 || colon + 1 == value.size()) {
        return invalid("expected HOST:PORT, got " + quote(value));
      }
      Result<uint32_t> port = parse_u32(value.substr(colon + 1), 1, 65535);
      if (!port) return invalid("bad port: " + port.status().message());
      config.http_listen = value;
      return Status::ok();
    }
    case Key::kHttpConnectionsPerPeer: {
      Result<uint32_t> n = parse_u32(value, 1, 1u << 20);
      if (!n) return n.status();
      config.http_connections_per_peer = *n;
      return Status::ok();
    }
    case Key::kModelDirs: {
      std::vector<std::string> dirs;
      std::string_view rest = value;
      while (true) {
        const size_t colon = rest.find(':');
        const std::string_view item = trim(rest.substr(0, colon));
        if (item.empty()) return invalid("empty entry in the directory list " + quote(value));
        dirs.push_back(absolute_path(item, origin));
        if (colon == std::string_view::npos) break;
        rest.remove_prefix(colon + 1);
      }
      config.model_dirs = std::move(dirs);
      return Status::ok();
    }
    case Key::kKeepAlive: {
      if (value == "0") {
        config.keep_alive_s = 0;
        return Status::ok();
      }
      Result<double> s = parse_seconds(value);
      if (!s) return s.status();
      config.keep_alive_s = *s;
      return Status::ok();
    }
    case Key::kHttpKeys:
      config.http_keys = absolute_path(value, origin);
      return Status::ok();
    case Key::kHttpNoAuth:
      if (value != "true" && value != "false") return invalid("expected true or false, got " + quote(value));
      config.http_no_auth = value == "true";
      return Status::ok();
    case Key::kLoad: {
      Result<ModelToLoad> model = parse_load(value, origin);
      if (!model) return model.status();
      for (const ModelToLoad& other : config.load) {
        if (other.id == model->id) {
          return invalid("model id " + quote(model->id) + " is already used by " + quote(other.path) +
                         " (give one of them another id=)");
        }
      }
      config.load.push_back(std::move(*model));
      return Status::ok();
    }
  }
  INFERD_ASSERT(false, "unhandled key");
  return Status::ok();
}

Status apply_file(const std::string& path, std::string_view text, const Origin& origin,
                  DaemonConfig& config) {
  int first_line[std::size(kKeys)] = {};  // where each key was set; 0: not yet
  int line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    const std::string_view raw = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    const std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#') continue;

    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) return invalid(where + "expected 'key = value', got " + quote(line));
    const std::string_view name = trim(line.substr(0, eq));
    const std::string_view value = trim(line.substr(eq + 1));
    if (name.empty()) return invalid(where + "no key before '=' in " + quote(line));
    const KeyInfo* info = find_key(name);
    if (info == nullptr) {
      std::string hint;
      if (name == "config") hint = " (config is only a command-line flag)";
      else if (name.starts_with("-")) hint = " (write keys without the leading '--')";
      return invalid(where + "unknown key " + quote(name) + hint);
    }
    const size_t index = static_cast<size_t>(info - kKeys);
    if (info->key != Key::kLoad && first_line[index] != 0) {
      return invalid(where + quote(name) + " is already set at line " + std::to_string(first_line[index]));
    }
    first_line[index] = line_no;
    if (value.empty()) return invalid(where + "missing value for " + quote(name));
    Status status = apply(info->key, value, origin, config);
    if (!status.is_ok()) return invalid(where + std::string(name) + ": " + status.message());
  }
  return Status::ok();
}

// One command-line flag, split into its name and value.
struct Flag {
  std::string_view name;  // without "--"
  std::string_view value;
};

// Splits argv into flags; --help was handled before. Only syntax is checked here.
Result<std::vector<Flag>> split_flags(int argc, const char* const* argv) {
  std::vector<Flag> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (!arg.starts_with("--") || arg.size() == 2) {
      return invalid("unexpected argument " + quote(arg) + " (see --help)");
    }
    const std::string_view body = arg.substr(2);
    const size_t eq = body.find('=');
    Flag flag{body.substr(0, eq), {}};
    if (flag.name != "config" && find_key(flag.name) == nullptr) {
      return invalid("--" + std::string(flag.name) + ": unknown flag (see --help)");
    }
    if (eq != std::string_view::npos) {
      flag.value = trim(body.substr(eq + 1));
    } else if (i + 1 < argc && !std::string_view(argv[i + 1]).starts_with("--")) {
      flag.value = trim(argv[++i]);
    }
    if (flag.value.empty()) return invalid("--" + std::string(flag.name) + ": missing value");
    flags.push_back(flag);
  }
  return flags;
}

}  // namespace

bool is_help_request(const Status& status) { return status.code() == kHelpRequested; }

std::string default_socket_path() {
  const char* env = std::getenv("INFERD_SOCKET");
  if (env != nullptr && *env != '\0') return env;
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && *runtime != '\0') return std::string(runtime) + "/inferd/inferd.sock";
  if (::geteuid() == 0) return "/run/inferd/inferd.sock";
  return "/tmp/inferd-" + std::to_string(::geteuid()) + "/inferd.sock";
}

Result<std::string> read_small_file(const std::string& path, size_t max_bytes, bool follow_links,
                                    const std::function<Status(const struct stat&)>& check) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow_links ? 0 : O_NOFOLLOW));
  if (fd < 0) {
    const int err = errno;
    return Status(err == ENOENT ? Code::kNotFound : Code::kFailed,
                  path + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  std::string text;
  Status status;
  if (::fstat(fd, &st) != 0) {
    status = Status(Code::kFailed, path + ": cannot stat: " + std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    status = invalid(path + ": not a regular file");
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    status = invalid(path + ": " + std::to_string(st.st_size) + " bytes; at most " + std::to_string(max_bytes) +
                     " are read");
  } else if (check && !(status = check(st))) {
    // refused by the caller's check
  } else {
    text.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = Status(Code::kFailed, path + ": cannot read: " + std::strerror(errno));
        break;
      }
      if (n == 0) break;  // the file shrank meanwhile: use what is there
      done += static_cast<size_t>(n);
    }
    text.resize(done);
  }
  ::close(fd);
  if (!status.is_ok()) return status;
  return text;
}

std::string default_http_socket(const std::string& socket_path) {
  constexpr std::string_view kSuffix = ".sock";
  if (socket_path.size() > kSuffix.size() && socket_path.ends_with(kSuffix)) {
    return socket_path.substr(0, socket_path.size() - kSuffix.size()) + "-http.sock";
  }
  return socket_path + "-http";
}

std::string default_worker_path() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec || exe.empty()) return "inferd-worker";
  return (exe.parent_path() / "inferd-worker").string();
}

Result<DaemonConfig> parse_config(int argc, const char* const* argv) {
  return parse_config(argc, argv, kDefaultConfigPath);
}

Result<DaemonConfig> parse_config(int argc, const char* const* argv,
                                  std::string_view default_config_path) {
  // --help wins over anything else on the line, wrong or not. A flag's value never starts with
  // "--", so a literal "--help" is always the flag.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return Status(kHelpRequested, usage());
  }
  Result<std::vector<Flag>> flags = split_flags(argc, argv);
  if (!flags) return flags.status();

  Result<std::string> cwd = current_dir();
  if (!cwd) return cwd.status();
  const Origin command_line{*cwd};

  std::string config_path;
  bool explicit_config = false;
  for (const Flag& flag : *flags) {
    if (flag.name == "config") {
      config_path = absolute_path(flag.value, command_line);
      explicit_config = true;
    }
  }
  if (!explicit_config) config_path = default_config_path;

  DaemonConfig config;
  if (!config_path.empty()) {
    Result<std::string> text = read_small_file(config_path, kMaxConfigBytes);
    if (text) {
      const Origin file{std::filesystem::path(absolute_path(config_path, command_line))
                            .parent_path()
                            .string()};
      INFERD_RETURN_IF_ERROR(apply_file(config_path, *text, file, config));
    } else if (explicit_config || text.status().code() != Code::kNotFound) {
      // A missing default file is fine; a missing named file or an unreadable one is not.
      return explicit_config ? text.status().with_context("--config") : text.status();
    }
  }

  bool flag_loads = false;  // the first --load replaces the file's list
  for (const Flag& flag : *flags) {
    if (flag.name == "config") continue;
    const KeyInfo* info = find_key(flag.name);
    INFERD_ASSERT(info != nullptr);
    if (info->key == Key::kLoad && !flag_loads) {
      config.load.clear();
      flag_loads = true;
    }
    Status status = apply(info->key, flag.value, command_line, config);
    if (!status.is_ok()) return invalid("--" + std::string(flag.name) + ": " + status.message());
  }

  if (config.socket_path.empty()) {
    Status status = apply(Key::kSocket, default_socket_path(), command_line, config);
    if (!status.is_ok()) return invalid("default socket path: " + status.message());
  }
  if (config.worker_path.empty()) config.worker_path = default_worker_path();
  return config;
}

std::string usage() {
  std::string text =
      "usage: inferd [--config PATH] [--KEY VALUE | --KEY=VALUE]...\n"
      "\n"
      "The inferd daemon: owns model weights in shared memory, runs inferd-worker processes and serves\n"
      "local clients (inferctl, libinferd-client) over a unix socket.\n"
      "\n"
      "  --config PATH          configuration file (default: /etc/inferd/inferd.conf if it exists)\n"
      "  --help, -h             print this text\n";
  for (const KeyInfo& info : kKeys) {
    std::string flag = "  --" + std::string(info.name) + " " + std::string(info.arg);
    if (flag.size() < 25) flag.resize(25, ' ');
    else if (!info.help.starts_with('\n')) flag += "\n" + std::string(25, ' ');
    text += flag + std::string(info.help) + "\n";
  }
  text +=
      "\n"
      "The file holds `KEY = VALUE` lines with the same keys (no leading --), `#` comment lines and\n"
      "blank lines; `load` may repeat. Flags override the file; --load and --admin-uids replace the\n"
      "file's lists. Relative paths in the file are relative to its directory.\n"
      "\n"
      "Under systemd (Type=notify) the daemon reports readiness and watchdog pings on $NOTIFY_SOCKET\n"
      "and accepts a listening socket passed by socket activation (inferd.socket).\n";
  return text;
}

}  // namespace inferd::daemon
