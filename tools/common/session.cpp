#include "session.h"

namespace inferd::cli {

Result<Session> open_session(const std::string& path, const EngineOptions& options, bool with_tokenizer) {
  Session s;
  auto model = Model::open(path);
  if (!model) return model.status();
  s.model = model.value();
  if (with_tokenizer) {
    auto tok = Tokenizer::from_gguf(s.model->file());
    if (!tok) return tok.status();
    s.tokenizer = std::move(tok).value();
  }
  auto engine = Engine::create(s.model, options);
  if (!engine) return engine.status();
  s.engine = std::move(engine).value();
  return s;
}

}  // namespace inferd::cli
