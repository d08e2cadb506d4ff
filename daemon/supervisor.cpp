#include "supervisor.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "inferd/backend_names.h"
#include "inferd/ipc/ring.h"
#include "inferd/ipc/weights_segment.h"
#include "inferd/model.h"
#include "inferd/tokenizer.h"
#include "model_host.h"

namespace inferd::daemon {
namespace {

std::string basename_id(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".gguf") == 0) base.resize(base.size() - 5);
  return base;
}

bool valid_id(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == ':';
  });
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Supervisor

Supervisor::Supervisor(DaemonConfig config)
    : config_(std::move(config)), work_(asio::make_work_guard(io_)), started_(Clock::now()) {}

Supervisor::~Supervisor() = default;

void Supervisor::run() { io_.run(); }

void Supervisor::stop() {
  if (stopping_) return;
  stopping_ = true;
  auto remaining = std::make_shared<size_t>(models_.size() + retiring_.size());
  auto done_one = [this, remaining] {
    if (--*remaining == 0) {
      work_.reset();
      io_.stop();
    }
  };
  if (*remaining == 0) {
    work_.reset();
    io_.stop();
    return;
  }
  for (auto& [id, host] : models_) host->shutdown(Status(Code::kDisconnected, "the daemon is shutting down"), done_one);
  for (auto& host : retiring_) host->shutdown(Status(Code::kDisconnected, "the daemon is shutting down"), done_one);
}

ModelHost* Supervisor::find(const std::string& id) const {
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second.get();
}

void Supervisor::load(LoadSpec spec, std::shared_ptr<LoadProgressSink> progress,
                      std::function<void(Result<ModelInfoData>)> done) {
  auto fail = [&](Code code, const std::string& why) { done(Status(code, why)); };
  if (stopping_) return fail(Code::kDisconnected, "the daemon is shutting down");
  if (spec.path.empty() || spec.path[0] != '/') {
    return fail(Code::kInvalidArgument, "model path must be absolute, got '" + spec.path + "'");
  }
  if (spec.id.empty()) spec.id = basename_id(spec.path);
  if (!valid_id(spec.id)) {
    return fail(Code::kInvalidArgument, "model id '" + spec.id + "' must be 1-128 characters of A-Z a-z 0-9 . _ - :");
  }
  if (models_.count(spec.id)) return fail(Code::kInvalidArgument, "a model with id '" + spec.id + "' is already loaded");
  if (spec.backend.empty()) spec.backend = "cpu";
  // "opencl" or "opencl:N" (device N): the worker checks N against the devices it finds.
  auto check_backend = [](const std::string& name) { return check_backend_name(name); };
  if (Status s = check_backend(spec.backend); !s) return done(s);
  if (!spec.stage_backends.empty()) {
    if (spec.stage_backends.size() != spec.layer_split.size() + 1) {
      return fail(Code::kInvalidArgument, "stage backends name " + std::to_string(spec.stage_backends.size()) +
                                              " backends for " + std::to_string(spec.layer_split.size() + 1) +
                                              " pipeline stages (layer split + 1)");
    }
    for (size_t i = 0; i < spec.stage_backends.size(); ++i) {
      if (Status s = check_backend(spec.stage_backends[i]); !s) {
        return done(s.with_context("stage " + std::to_string(i)));
      }
    }
  }
  if (spec.parallel == 0) spec.parallel = config_.default_parallel;
  if (spec.parallel > ipc::kMaxStepSeqs) {
    return fail(Code::kInvalidArgument, "parallel must be in [1, " + std::to_string(ipc::kMaxStepSeqs) + "]");
  }
  if (spec.context_size == 0) spec.context_size = config_.default_context;
  if (spec.context_size != 0 && (spec.context_size < 16 || spec.context_size > 131072)) {
    return fail(Code::kInvalidArgument, "context size must be in [16, 131072]");
  }
  if (spec.threads == 0) spec.threads = config_.threads;
  if (spec.threads > 1024) return fail(Code::kInvalidArgument, "threads must be at most 1024");
  if (spec.batch_tokens == 0) spec.batch_tokens = 512;
  if (spec.batch_tokens > ipc::kMaxStepTokens) {
    return fail(Code::kInvalidArgument, "batch tokens must be in [1, " + std::to_string(ipc::kMaxStepTokens) + "]");
  }
  if (spec.pad_step == 0) spec.pad_step = 64;
  if (spec.pad_step != 64 && spec.pad_step != 128) return fail(Code::kInvalidArgument, "pad step must be 64 or 128");
  if (spec.max_queue == 0) spec.max_queue = config_.max_queue;

  const uint64_t serial = ++load_serial_;
  auto host_ptr = std::make_unique<ModelHost>(*this, spec, serial);
  ModelHost* host = host_ptr.get();
  models_.emplace(spec.id, std::move(host_ptr));
  spdlog::info("loading {} as {} ({} slots, context {}, {} threads)", spec.path, spec.id, spec.parallel,
               spec.context_size ? std::to_string(spec.context_size) : std::string("default"),
               spec.threads ? std::to_string(spec.threads) : std::string("all"));
  const auto t0 = Clock::now();
  std::string id = spec.id;
  // The copy into shared memory runs on its own thread; the result comes back to this io_context.
  host->loader() = std::thread([this, spec, progress, done, t0, id, serial]() mutable {
    if (progress) progress->update("copying", 0, 1);
    auto weights = ipc::WeightsSegment::create(spec.path, [&](uint64_t d, uint64_t t) {
      if (progress) progress->update("copying", d, t);
    });
    Result<std::shared_ptr<const Model>> model = Status(Code::kFailed, "not loaded");
    Result<std::unique_ptr<Tokenizer>> tokenizer = Status(Code::kFailed, "not loaded");
    if (weights) {
      if (progress) progress->update("validating", 0, 1);
      model = Model::load(weights.value()->gguf());
      if (model) tokenizer = Tokenizer::from_gguf(*weights.value()->gguf());
    }
    auto shared = std::make_shared<std::tuple<decltype(weights), decltype(model), decltype(tokenizer)>>(
        std::move(weights), std::move(model), std::move(tokenizer));
    asio::post(io_, [this, shared, progress, done, t0, id, serial] {
      auto& [w, m, t] = *shared;
      ModelHost* h = find(id);
      if (!h || h->serial() != serial) return done(Status(Code::kFailed, "model " + id + " was unloaded while loading"));
      Status err = !w ? w.status() : !m ? m.status() : !t ? t.status() : Status::ok();
      if (!err) {
        spdlog::error("load of {} failed: {}", id, err.to_string());
        models_.erase(id);  // joins the loader thread, which has nothing left to do
        return done(err);
      }
      Status laid_out = h->attach(std::move(w).value(), std::move(m).value(), std::move(t).value(),
                                  ms_between(t0, Clock::now()));
      if (!laid_out) {
        models_.erase(id);
        return done(laid_out);
      }
      if (progress) progress->update("starting workers", 0, 1);
      h->start([this, h, done, progress, id](Status s) {
        if (!s) {
          spdlog::error("load of {} failed: {}", id, s.to_string());
          if (ModelHost* again = find(id); again == h) {
            auto node = models_.extract(id);
            auto* raw = node.mapped().get();
            retiring_.push_back(std::move(node.mapped()));
            raw->shutdown(s, [this, raw] { std::erase_if(retiring_, [raw](auto& r) { return r.get() == raw; }); });
          }
          return done(s);
        }
        if (progress) progress->update("starting workers", 1, 1);
        spdlog::info("model {} ready: {}", id, h->info().description);
        done(h->info());
      });
    });
  });
}

Status Supervisor::unload(const std::string& id) {
  auto it = models_.find(id);
  if (it == models_.end()) return Status(Code::kNotFound, "no model with id '" + id + "' is loaded");
  ModelHost* raw = it->second.get();
  retiring_.push_back(std::move(it->second));
  models_.erase(it);
  spdlog::info("unloading {}", id);
  raw->shutdown(Status(Code::kFailed, "model " + id + " was unloaded"),
                [this, raw] { std::erase_if(retiring_, [raw](auto& r) { return r.get() == raw; }); });
  return Status::ok();
}

std::vector<ModelInfoData> Supervisor::list() const {
  std::vector<ModelInfoData> out;
  for (auto& [id, host] : models_) out.push_back(host->info());
  return out;
}

DaemonStatusData Supervisor::status() const {
  DaemonStatusData st;
  st.version = INFERD_VERSION;
  st.pid = static_cast<uint32_t>(::getpid());
  st.uptime_ms = static_cast<uint64_t>(ms_between(started_, Clock::now()));
  st.socket_path = config_.socket_path;
  for (auto& [id, host] : models_) st.models.push_back(host->status());
  st.connections = connections_;
  st.requests_total = requests_total_;
  st.requests_rejected = requests_rejected_;
  st.rss_bytes = process_memory(::getpid()).first;
  return st;
}

Result<std::vector<int32_t>> Supervisor::tokenize(const std::string& model, const std::string& text, bool add_special,
                                                  bool parse_special) const {
  ModelHost* h = find(model);
  if (!h) return Status(Code::kNotFound, "no model with id '" + model + "' is loaded");
  if (!h->tokenizer()) return Status(Code::kFailed, "model " + model + " is still loading");
  return h->tokenizer()->encode(text, add_special, parse_special);
}

Result<std::string> Supervisor::detokenize(const std::string& model, const std::vector<int32_t>& tokens) const {
  ModelHost* h = find(model);
  if (!h) return Status(Code::kNotFound, "no model with id '" + model + "' is loaded");
  if (!h->tokenizer()) return Status(Code::kFailed, "model " + model + " is still loading");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= h->tokenizer()->n_vocab()) {
      return Status(Code::kInvalidArgument, "token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                                                ", outside the vocabulary");
    }
  }
  return h->tokenizer()->decode(tokens, false);
}

Status Supervisor::generate(GenerateParams params, std::shared_ptr<GenerationStream> stream) {
  ++requests_total_;
  ModelHost* h = find(params.model);
  if (!h) return Status(Code::kNotFound, "no model with id '" + params.model + "' is loaded");
  Status s = h->enqueue(std::move(params), std::move(stream));
  if (s.code() == Code::kOverloaded) ++requests_rejected_;
  return s;
}

void Supervisor::kick(const std::string& model) {
  if (ModelHost* h = find(model)) h->schedule();
}

}  // namespace inferd::daemon
