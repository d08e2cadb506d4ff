#include "supervisor.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
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

Supervisor::~Supervisor() {
  loads_->close();
  text_pool_.stop();  // text jobs not yet started are dropped (their replies never run)
  text_pool_.join();
}

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
    sweep_timer_.cancel();
    work_.reset();
    io_.stop();
    return;
  }
  sweep_timer_.cancel();
  for (auto& [id, waiting] : parked_) {
    for (Parked& p : waiting) p.reply(Status(Code::kDisconnected, "the daemon is shutting down"));
  }
  parked_.clear();
  for (auto& [id, host] : models_) host->shutdown(Status(Code::kDisconnected, "the daemon is shutting down"), done_one);
  for (auto& host : retiring_) host->shutdown(Status(Code::kDisconnected, "the daemon is shutting down"), done_one);
}

ModelHost* Supervisor::find(const std::string& id) const {
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second.get();
}

void Supervisor::load(LoadSpec spec, std::shared_ptr<LoadProgressSink> client_progress,
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
  if (spec.cache_tokens > (1u << 24)) return fail(Code::kInvalidArgument, "cache tokens must be at most 16777216");
  if (!spec.chat_template.empty()) {
    auto family = chat_template_by_name(spec.chat_template);
    if (!family) return fail(Code::kInvalidArgument, family.status().message());
  }
  if (!(spec.keep_alive_s >= 0) || spec.keep_alive_s > 365.0 * 86400) {
    return fail(Code::kInvalidArgument, "keep-alive must be 0 (never unload) to a year, in seconds");
  }
  // Requests parked for this model go on (or fail) once the load ends, whichever way it ends.
  done = [this, id = spec.id, user = std::move(done)](Result<ModelInfoData> r) {
    const Status s = r ? Status::ok() : r.status();
    user(std::move(r));
    release_parked(id, s);
  };
  if (spec.keep_alive_s > 0) {
    last_busy_[spec.id] = Clock::now();
    arm_sweep();
  }

  const uint64_t serial = ++load_serial_;
  auto tracker = std::make_shared<LoadTracker>(std::move(client_progress));
  auto host = std::make_unique<ModelHost>(*this, spec, serial);
  host->set_load_tracker(tracker);
  models_.emplace(spec.id, std::move(host));
  std::shared_ptr<LoadProgressSink> progress = tracker;
  spdlog::info("loading {} as {} ({} slots, context {}, {} threads)", spec.path, spec.id, spec.parallel,
               spec.context_size ? std::to_string(spec.context_size) : std::string("default"),
               spec.threads ? std::to_string(spec.threads) : std::string("all"));
  const auto t0 = Clock::now();
  std::string id = spec.id;
  // The copy into shared memory runs on its own detached thread; the result comes back to this
  // io_context through the load channel (dropped if the supervisor is gone by then).
  std::thread([this, channel = loads_, spec, progress, done, t0, id, serial]() mutable {
    if (progress) progress->update("copying", 0, 1);
    auto weights = ipc::WeightsSegment::create(spec.path, [&](std::string_view stage, uint64_t d, uint64_t t) {
      if (progress) progress->update(std::string(stage), d, t);
    });
    Result<std::shared_ptr<const Model>> model = Status(Code::kFailed, "not loaded");
    Result<std::unique_ptr<Tokenizer>> tokenizer = Status(Code::kFailed, "not loaded");
    if (weights) {
      if (progress) progress->update("validating", 0, 1);
      model = Model::load(weights.value()->gguf());
      if (model) tokenizer = Tokenizer::from_gguf(*weights.value()->gguf());
      // Every token needs an embedding row (rows past the vocabulary are padding the workers never sample).
      if (model && tokenizer && tokenizer.value()->n_vocab() > model.value()->config().n_vocab) {
        tokenizer = Status(Code::kCorrupt, spec.path + ": the vocabulary has " +
                                               std::to_string(tokenizer.value()->n_vocab()) +
                                               " tokens but the embedding matrix only " +
                                               std::to_string(model.value()->config().n_vocab) + " rows");
      }
    }
    auto shared = std::make_shared<std::tuple<decltype(weights), decltype(model), decltype(tokenizer)>>(
        std::move(weights), std::move(model), std::move(tokenizer));
    channel->post([this, shared, progress, done, t0, id, serial] {
      auto& [w, m, t] = *shared;
      ModelHost* h = find(id);
      if (!h || h->serial() != serial) return done(Status(Code::kFailed, "model " + id + " was unloaded while loading"));
      Status err = !w ? w.status() : !m ? m.status() : !t ? t.status() : Status::ok();
      if (!err) {
        spdlog::error("load of {} failed: {}", id, err.to_string());
        models_.erase(id);
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
  }).detach();
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

ModelInfoData Supervisor::with_keep_alive(const ModelHost& h, ModelInfoData m) const {
  m.keep_alive_s = h.spec().keep_alive_s;
  auto it = last_busy_.find(m.id);
  if (m.keep_alive_s > 0 && it != last_busy_.end() && m.state == ModelState::kReady && h.in_flight() == 0) {
    m.unload_in_s = std::max(0.0, m.keep_alive_s - ms_between(it->second, Clock::now()) / 1e3);
  }
  return m;
}

std::vector<ModelInfoData> Supervisor::list() const {
  std::vector<ModelInfoData> out;
  for (auto& [id, host] : models_) out.push_back(with_keep_alive(*host, host->info()));
  return out;
}

DaemonStatusData Supervisor::status() const {
  DaemonStatusData st;
  st.version = INFERD_VERSION;
  st.pid = static_cast<uint32_t>(::getpid());
  st.uptime_ms = static_cast<uint64_t>(ms_between(started_, Clock::now()));
  st.socket_path = config_.socket_path;
  for (auto& [id, host] : models_) {
    st.models.push_back(host->status());
    st.models.back().info = with_keep_alive(*host, std::move(st.models.back().info));
  }
  st.connections = connections_;
  st.requests_total = requests_total_;
  st.requests_rejected = requests_rejected_;
  st.rss_bytes = process_memory(::getpid()).first;
  return st;
}

namespace {

Status text_too_large(size_t bytes, uint32_t limit, const char* what) {
  return Status(Code::kInvalidArgument, std::string(what) + " is " + std::to_string(bytes) +
                                            " bytes, more than this daemon tokenizes in one request (max-text-bytes " +
                                            std::to_string(limit) + ")");
}

}  // namespace

void Supervisor::tokenize(const std::string& model, std::string text, bool add_special, bool parse_special,
                          Reply<Result<std::vector<int32_t>>> reply) {
  ModelHost* h = find(model);
  if (!h) return reply(Status(Code::kNotFound, "no model with id '" + model + "' is loaded"));
  if (!h->tokenizer()) return reply(Status(Code::kFailed, "model " + model + " is still loading"));
  if (text.size() > config_.max_text_bytes) return reply(text_too_large(text.size(), config_.max_text_bytes, "the text"));
  asio::post(text_pool_, [tok = h->shared_tokenizer(), text = std::move(text), add_special, parse_special,
                          reply = std::move(reply)] { reply(tok->encode(text, add_special, parse_special)); });
}

void Supervisor::detokenize(const std::string& model, std::vector<int32_t> tokens, Reply<Result<std::string>> reply) {
  ModelHost* h = find(model);
  if (!h) return reply(Status(Code::kNotFound, "no model with id '" + model + "' is loaded"));
  if (!h->tokenizer()) return reply(Status(Code::kFailed, "model " + model + " is still loading"));
  // A token decodes to a few bytes on average but to hundreds at most: the count is bounded so that the
  // text stays within reach of max-text-bytes.
  const size_t max_tokens = config_.max_text_bytes / 16;
  if (tokens.size() > max_tokens) {
    return reply(Status(Code::kInvalidArgument, "detokenize takes at most " + std::to_string(max_tokens) +
                                                    " tokens (max-text-bytes / 16), got " +
                                                    std::to_string(tokens.size())));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= h->tokenizer()->n_vocab()) {
      return reply(Status(Code::kInvalidArgument, "token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                                                      ", outside the vocabulary"));
    }
  }
  asio::post(text_pool_, [tok = h->shared_tokenizer(), tokens = std::move(tokens), reply = std::move(reply)] {
    reply(tok->decode(tokens, false));
  });
}

void Supervisor::generate(GenerateParams params, std::shared_ptr<GenerationStream> stream, Reply<Status> reply) {
  ++requests_total_;
  auto answer = [this, reply](Status s) {
    if (s.code() == Code::kOverloaded) ++requests_rejected_;
    reply(std::move(s));
  };
  if (stopping_) return answer(Status(Code::kDisconnected, "the daemon is shutting down"));
  ModelHost* h = find(params.model);
  if (!h && !valid_id(params.model)) {
    return answer(Status(Code::kNotFound, "no model with id '" + params.model + "' is loaded"));
  }
  if (!h || h->state() == ModelState::kLoading) {
    std::vector<Parked>& waiting = parked_[params.model];
    if (!h) {
      const std::optional<std::string> path = model_file(params.model);
      if (!path) {
        parked_.erase(params.model);
        return answer(Status(Code::kNotFound, "no model with id '" + params.model + "' is loaded" +
                                                  (config_.model_dirs.empty() ? "" : " or found in model-dirs")));
      }
      LoadSpec spec;
      spec.path = *path;
      spec.id = params.model;
      spec.keep_alive_s = params.keep_alive_s >= 0 ? params.keep_alive_s : config_.keep_alive_s;
      spec.by_name = true;
      spdlog::info("model {} requested by name: loading {}", spec.id, spec.path);
      waiting.push_back(Parked{std::move(params), std::move(stream), answer});
      load(spec, nullptr, [id = spec.id](Result<ModelInfoData> r) {
        if (!r) spdlog::error("load of {} by name failed: {}", id, r.status().message());
      });
      return;
    }
    if (waiting.size() >= config_.max_queue) {
      return answer(Status(Code::kOverloaded, "model " + params.model + " is loading and " +
                                                  std::to_string(waiting.size()) + " requests already wait for it"));
    }
    waiting.push_back(Parked{std::move(params), std::move(stream), answer});
    return;
  }
  if (params.keep_alive_s >= 0 && h->spec().by_name && params.keep_alive_s != h->spec().keep_alive_s) {
    set_keep_alive(*h, params.keep_alive_s);
  }
  if (last_busy_.count(params.model)) last_busy_[params.model] = Clock::now();
  if (Status ok = h->admit(params); !ok) return answer(ok);  // before any tokenizing
  // A client that takes its backlog lets its sequence go on (the scheduler paused it).
  stream->set_on_drain([this, model = params.model] { post([this, model] { kick(model); }); });
  const bool text_input = params.input != GenerateParams::Input::kTokens;
  std::string text;
  if (text_input) {
    size_t bytes = params.prompt.size();
    for (const ChatMessage& m : params.messages) bytes += m.role.size() + m.content.size();
    if (bytes > config_.max_text_bytes) return answer(text_too_large(bytes, config_.max_text_bytes, "the prompt"));
    auto rendered = h->prompt_text(params);
    if (!rendered) return answer(rendered.status());
    text = std::move(rendered).value();
  }
  // Every request passes through the text pool's one thread, so requests are queued in the order they
  // arrived, whether their input was text or tokens.
  const bool parse_special = params.input == GenerateParams::Input::kMessages || params.parse_special;
  const uint64_t serial = h->serial();
  asio::post(text_pool_, [this, tok = h->shared_tokenizer(), text = std::move(text), text_input, parse_special, serial,
                          params = std::move(params), stream = std::move(stream), answer]() mutable {
    if (text_input) {
      params.tokens = tok->encode(text, params.add_special, parse_special);
      params.input = GenerateParams::Input::kTokens;
      params.prompt.clear();
      params.messages.clear();
    }
    asio::post(io_, [this, serial, params = std::move(params), stream = std::move(stream), answer]() mutable {
      ModelHost* again = find(params.model);
      if (!again || again->serial() != serial) {
        return answer(Status(Code::kFailed, "model " + params.model + " was unloaded while the prompt was tokenized"));
      }
      answer(again->enqueue(std::move(params), std::move(stream)));
    });
  });
}

std::optional<std::string> Supervisor::model_file(const std::string& name) const {
  if (name.empty() || name.size() > 128 || name.find('/') != std::string::npos || name[0] == '.') return std::nullopt;
  for (const std::string& dir : config_.model_dirs) {
    for (const std::string& candidate : {dir + "/" + name, dir + "/" + name + ".gguf"}) {
      struct stat st {};
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return candidate;
    }
  }
  return std::nullopt;
}

void Supervisor::release_parked(const std::string& id, const Status& loaded) {
  auto it = parked_.find(id);
  if (it == parked_.end()) return;
  std::vector<Parked> waiting = std::move(it->second);
  parked_.erase(it);
  for (Parked& p : waiting) {
    if (!loaded) {
      p.reply(Status(loaded.code(), "model " + id + " could not be loaded: " + loaded.message()));
    } else {
      generate(std::move(p.params), std::move(p.stream), std::move(p.reply));
    }
  }
}

void Supervisor::arm_sweep() {
  if (sweep_armed_ || stopping_) return;
  sweep_armed_ = true;
  sweep_timer_.expires_after(std::chrono::seconds(1));
  sweep_timer_.async_wait([this](const asio::error_code& ec) {
    sweep_armed_ = false;
    if (!ec) sweep_idle();
  });
}

void Supervisor::sweep_idle() {
  if (stopping_) return;
  const auto now = Clock::now();
  std::vector<std::string> idle;
  for (auto it = last_busy_.begin(); it != last_busy_.end();) {
    ModelHost* h = find(it->first);
    if (h == nullptr) {  // unloaded meanwhile
      it = last_busy_.erase(it);
      continue;
    }
    if (h->state() != ModelState::kReady || h->in_flight() > 0 || parked_.count(it->first)) {
      it->second = now;
    } else if (ms_between(it->second, now) / 1e3 >= h->spec().keep_alive_s) {
      idle.push_back(it->first);
    }
    ++it;
  }
  for (const std::string& id : idle) {
    spdlog::info("model {} idle for its keep-alive of {:.0f} s: unloading", id, find(id)->spec().keep_alive_s);
    last_busy_.erase(id);
    (void)unload(id);
  }
  if (!last_busy_.empty()) arm_sweep();
}

void Supervisor::set_keep_alive(ModelHost& h, double seconds) {
  const std::string& id = h.spec().id;
  spdlog::info("model {}: keep-alive {:.0f} s (was {:.0f} s), as a request asks", id, seconds, h.spec().keep_alive_s);
  h.set_keep_alive(seconds);
  if (seconds > 0) {
    last_busy_[id] = Clock::now();
    arm_sweep();
  } else {
    last_busy_.erase(id);
  }
}

void Supervisor::kick(const std::string& model) {
  if (ModelHost* h = find(model)) h->schedule();
}

}  // namespace inferd::daemon
