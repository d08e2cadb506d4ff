// tools/common/session.h — what the in-process tools open: a model, its tokenizer and an engine.
// Thread safety: single-threaded use at start-up.
#pragma once

#include <memory>
#include <string>

#include "inferd/engine.h"
#include "inferd/status.h"
#include "inferd/tokenizer.h"

namespace inferd::cli {

struct Session {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null unless requested
  std::unique_ptr<Engine> engine;
};

// Opens the model at `path`, its tokenizer when `with_tokenizer`, and an engine with `options`.
Result<Session> open_session(const std::string& path, const EngineOptions& options, bool with_tokenizer);

}  // namespace inferd::cli
