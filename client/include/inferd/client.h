// inferd/client.h — libinferd-client: talk to a running inferd daemon from C++.
//
// Plain C++ types only: an application needs neither Cap'n Proto nor the schema to use this header
// (the wire format is schemas/inferd.capnp; clients in other languages use that file directly).
//
// Thread safety: a Client is bound to the thread that constructed it (Cap'n Proto's event loop is
// per thread) and must only be used, moved and destroyed on that thread. Each thread that wants to
// talk to the daemon constructs its own Client; Clients on different threads are independent.
// Callbacks (load progress, generated batches) run on the calling thread, inside the call.
//
// Errors: every call that reaches the daemon may throw Error; kind() says what the caller can do
// (see ErrorKind). Nothing else is thrown except std::bad_alloc and what a callback itself throws
// (which is rethrown unchanged after the call has been dropped).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

// The library is built with hidden visibility; this marks its API.
#if defined(__GNUC__)
#define INFERD_CLIENT_API __attribute__((visibility("default")))
#else
#define INFERD_CLIENT_API
#endif

namespace inferd::client {

// The kind of a failure, after the daemon's Cap'n Proto exception types.
enum class ErrorKind {
  kFailed,         // the request is wrong (unknown model, bad path, invalid value): retrying won't help
  kOverloaded,     // the daemon's admission queue is full: back off and retry
  kDisconnected,   // the connection or the worker running the request died: reconnect / retry
  kUnimplemented,  // the daemon does not support what was asked (e.g. a backend it lacks)
  kConnect,        // the daemon could not be reached at all (not running, wrong socket, permissions)
};
INFERD_CLIENT_API const char* to_string(ErrorKind kind);

class INFERD_CLIENT_API Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message);
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Zero / empty fields mean "the daemon's default" (see LoadOptions in schemas/inferd.capnp).
struct LoadOptions {
  std::string id;  // empty: the file name without ".gguf"
  uint32_t context_size = 0;
  uint32_t parallel = 0;
  uint32_t threads = 0;
  std::string backend;  // "cpu", "cuda", "opencl"
  uint32_t batch_tokens = 0;
  uint32_t pad_step = 0;
  uint32_t max_queue = 0;
  // Pipeline placement: the first layer of each worker after the first ({15} on a 30-layer model:
  // worker 0 runs layers 0-14, worker 1 layers 15-29). Empty: one worker runs every layer.
  std::vector<uint32_t> layer_split;
  // The backend of each worker, in pipeline order ({"opencl", "cpu"} with layer_split {15}: the first
  // 15 layers on the GPU, like llama.cpp's -ngl). Empty: every worker uses `backend`; otherwise
  // layer_split.size() + 1 names.
  std::vector<std::string> stage_backends;
  double keep_alive_s = 0;  // unload after this many seconds without a request; 0: never
  // KV positions kept for cached prompt prefixes beyond parallel × context_size (0: none extra; cached
  // prefixes then live in the room the slots do not use).
  uint32_t cache_tokens = 0;
  // How chat messages become the prompt: "" the file's own template (Jinja), else a built-in format by
  // name (chatml, llama3, llama2, zephyr, phi3, gemma).
  std::string chat_template;
};

struct PlacementStage {
  uint32_t worker = 0;  // index into ModelInfo::workers
  std::string backend;
  uint32_t first_layer = 0;  // [first_layer, end_layer)
  uint32_t end_layer = 0;
  bool embeddings = false;
  bool output = false;
};

// One assignment of the placement plan: which operators of the model's graph a worker runs.
struct PlacementAssignment {
  uint32_t worker = 0;
  std::string backend;
  bool embeddings = false;
  uint32_t first_layer = 0, end_layer = 0;  // layers [first_layer, end_layer)
  bool output = false;
  std::vector<std::string> operators;       // only these operators of the layers; empty: all
  uint64_t neuron_begin = 0, neuron_end = 0;  // only these FFN neurons; 0, 0: all
  uint32_t nodes = 0;                       // graph operators the worker runs
};

// A tensor that crosses workers.
struct PlacementExchange {
  uint32_t from_worker = 0, to_worker = 0;
  std::string tensor;  // e.g. "blk.14.ffn_res"
  uint32_t floats_per_token = 0;
  std::string via;     // e.g. "shared memory (hidden-state exchange)"
};

struct Placement {
  std::vector<PlacementStage> stages;  // in pipeline order
  std::string summary;                 // e.g. "cpu:0 layers 0-29 + embeddings + output"
  std::vector<PlacementAssignment> assignments;  // the plan, in order
  std::vector<PlacementExchange> exchanges;
};

enum class ModelState { kLoading, kReady, kRecovering, kFailed };
INFERD_CLIENT_API const char* to_string(ModelState state);  // "loading", "ready", ...

struct WorkerInfo {
  uint32_t index = 0;
  std::string backend;
  uint32_t pid = 0;
  std::string state;  // "starting", "ready", "restarting", "failed"
  uint64_t rss_bytes = 0;     // private resident memory
  uint64_t shared_bytes = 0;  // resident pages of the shared weights segment
  uint64_t uptime_ms = 0;
  uint32_t restarts = 0;
  double last_restart_ms = 0;  // crash to restarted worker ready
  uint64_t steps = 0;
  uint64_t tokens = 0;
  std::string device;
};

struct ModelInfo {
  std::string id, path, name, arch, description;
  ModelState state = ModelState::kLoading;
  uint64_t weights_bytes = 0;
  uint64_t weights_huge_page_bytes = 0;  // of weights_bytes, backed by 2 MiB pages
  uint32_t context_size = 0;
  uint32_t parallel = 0;
  uint32_t vocab_size = 0;
  std::string chat_template;
  Placement placement;
  std::vector<WorkerInfo> workers;
  double load_ms = 0;
  double keep_alive_s = 0;  // 0: never unloaded for idleness
  double unload_in_s = -1;  // seconds until the idle unload; -1: not scheduled
  // While loading: the stage ("copying", "validating", "starting workers") and its progress.
  std::string load_stage;
  uint64_t load_done = 0, load_total = 0;
};

struct ModelStatus {
  ModelInfo info;
  uint64_t kv_bytes = 0;
  uint32_t slots_used = 0;
  uint64_t kv_tokens_used = 0;
  uint32_t requests_active = 0;
  uint32_t requests_queued = 0;
  uint64_t requests_done = 0;
  uint64_t requests_failed = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  double decode_tokens_per_second = 0;
  uint64_t replays = 0;
  double step_compute_us = 0;   // mean time of a step inside the workers
  double step_overhead_us = 0;  // mean time of a step outside them (rings, wake-ups, scheduling)
  // The prefix cache: the KV pool in blocks of 64 positions, those held by requests in flight, those
  // kept for later requests (evictable); requests that found a cached prefix, the prompt tokens taken
  // from it, blocks evicted.
  uint32_t cache_blocks = 0, cache_blocks_used = 0, cache_blocks_cached = 0;
  uint64_t cache_hits = 0, cache_hit_tokens = 0, cache_evictions = 0;
};

struct DaemonStatus {
  std::string version;
  uint32_t protocol_version = 0;
  uint32_t pid = 0;
  uint64_t uptime_ms = 0;
  std::string socket_path;
  std::vector<ModelStatus> models;
  uint32_t connections = 0;
  uint64_t requests_total = 0;
  uint64_t requests_rejected = 0;  // OVERLOADED answers
  uint64_t rss_bytes = 0;
};

// llama.cpp's sampler fields, defaults and ranges; the daemon refuses out-of-range values (kFailed).
struct Sampling {
  float temperature = 0.8f;  // [0, 100]; 0 = greedy
  int32_t top_k = 40;        // <= 0: disabled
  float top_p = 0.95f;       // (0, 1]
  float min_p = 0.05f;       // [0, 1)
  float repeat_penalty = 1.0f;
  int32_t repeat_last_n = 64;  // -1: whole history
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  uint64_t seed = UINT64_MAX;  // UINT64_MAX: chosen by the daemon, reported in GenerateResult::seed
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct GenerateRequest {
  std::string model;
  // Exactly one input is sent: `messages` if non-empty, else `tokens` if non-empty, else `prompt`.
  std::string prompt;
  std::vector<ChatMessage> messages;  // formatted with the model's chat template
  std::vector<int32_t> tokens;
  Sampling sampling;
  uint32_t max_tokens = 256;  // 0: until end of generation or the context is full
  std::vector<std::string> stop;
  bool add_special = true;    // prepend BOS if the model wants it (prompt/messages only)
  bool parse_special = true;  // "<|im_start|>" etc. in the text become special tokens
  bool ignore_eog = false;    // keep going past end-of-generation tokens
  bool cache_prompt = true;   // reuse the KV of the longest cached prefix of the prompt
  // After the first batch, at most one batch per this many ms (the last is never held back); 0: each
  // batch as soon as it is ready; -1: the daemon's default (its stream-interval setting, 20 ms).
  int32_t stream_interval_ms = -1;
};

struct TokenBatch {
  std::vector<int32_t> tokens;  // ids generated since the previous batch
  std::string text;             // their text; complete UTF-8
};

enum class FinishReason {
  kEndOfGeneration,
  kMaxTokens,
  kStop,         // a stop string matched
  kContextFull,
  kCancelled,    // the client dropped the call (on_batch returned false or the cancel fd fired)
};
INFERD_CLIENT_API const char* to_string(FinishReason reason);  // "end of generation", "max tokens", ...

// For a cancelled generation only finish_reason is meaningful (the daemon sent no result).
struct GenerateResult {
  FinishReason finish_reason = FinishReason::kCancelled;
  uint32_t prompt_tokens = 0;
  uint32_t generated_tokens = 0;
  uint64_t seed = 0;  // the seed actually used: replays the run
  double queue_ms = 0;
  double time_to_first_token_ms = 0;  // from the request's arrival at the daemon
  double prompt_ms = 0;
  double generate_ms = 0;  // first to last generated token
  uint32_t replays = 0;    // times the request was replayed on a restarted worker
  uint32_t cached_tokens = 0;  // prompt tokens taken from the prefix cache (not computed)
};

// $INFERD_SOCKET; else $XDG_RUNTIME_DIR/inferd/inferd.sock if XDG_RUNTIME_DIR is set; else
// /run/inferd/inferd.sock for root; else /tmp/inferd-<uid>/inferd.sock.
INFERD_CLIENT_API std::string default_socket_path();

// (stage, done, total); stage is "validating", "copying" (bytes) or "starting workers" (workers).
using LoadProgressFn = std::function<void(std::string_view stage, uint64_t done, uint64_t total)>;
// Called once per batch; return false to cancel the generation.
using BatchFn = std::function<bool(const TokenBatch& batch)>;

class INFERD_CLIENT_API Client {
 public:
  // Connects and says hello. Throws Error(kConnect, "cannot connect to <path>: <why> (is inferd
  // running?)") when the socket cannot be reached, Error(kFailed, ...) when the daemon refuses the
  // client's protocol version.
  explicit Client(std::string socket_path = default_socket_path(),
                  std::string client_name = "libinferd-client");
  ~Client();
  // A moved-from Client may only be destroyed or assigned to.
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& socket_path() const;
  uint32_t protocol_version() const;
  std::string daemon_version() const;
  uint32_t daemon_pid() const;

  // Admin calls (the first one asks the daemon for its Admin capability; may fail with
  // "permission denied" where the daemon restricts admin calls).
  ModelInfo load(const std::string& path, const LoadOptions& options, LoadProgressFn progress = {});
  void unload(const std::string& id);
  DaemonStatus status();

  // Inference calls.
  std::vector<ModelInfo> list();
  std::vector<int32_t> tokenize(const std::string& model, const std::string& text,
                                bool add_special = true, bool parse_special = true);
  std::string detokenize(const std::string& model, const std::vector<int32_t>& tokens);

  // Streams batches to on_batch (called on this thread) and returns when generation ends. If
  // on_batch returns false, the call is dropped (= cancelled at the daemon) and the result has
  // kCancelled.
  GenerateResult generate(const GenerateRequest& request, const BatchFn& on_batch);

  // While generate() runs, a byte readable on `fd` cancels it exactly as if on_batch had returned
  // false; that one byte is consumed. The fd is switched to non-blocking mode but neither closed nor
  // owned; -1 (the default) disables. This lets a SIGINT handler cancel through a self-pipe (write()
  // is async-signal-safe): one byte written per signal cancels one generation, now or the next one.
  void set_cancel_fd(int fd);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd::client
