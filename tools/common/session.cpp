#include "session.h"

#include <cstdio>

#include "inferd/weight_layout.h"

namespace inferd::cli {

Result<WeightsSource> parse_weights_source(std::string_view name) {
  if (name == "shm") return WeightsSource::kShared;
  if (name == "mmap") return WeightsSource::kFileMap;
  return Status(Code::kInvalidArgument, "--weights must be 'shm' or 'mmap', not '" + std::string(name) + "'");
}

std::string LoadedModel::describe_weights() const {
  if (!segment) return note.empty() ? "file mapping" : "file mapping (" + note + ")";
  const ipc::WeightsHeader& h = segment->header();
  uint32_t interleaved = 0, matrices = 0;
  for (uint32_t i = 0; i < h.tensor_count; ++i) {
    const ipc::TensorEntry& e = segment->tensors()[i];
    matrices += e.n_dims == 2 ? 1 : 0;
    interleaved += e.layout != static_cast<uint32_t>(WeightLayout::kRows) ? 1 : 0;
  }
  char buf[192];
  std::snprintf(buf, sizeof buf, "shared memory, %.0f of %.0f MiB in 2 MiB pages, %u of %u matrices interleaved",
                static_cast<double>(segment->huge_page_bytes()) / 1048576.0,
                static_cast<double>(segment->size() - h.data_offset) / 1048576.0, interleaved, matrices);
  return buf;
}

Result<LoadedModel> open_model(const std::string& path, WeightsSource source) {
  LoadedModel out;
  if (source == WeightsSource::kShared) {
    auto seg = ipc::WeightsSegment::create(path, nullptr);
    if (seg) {
      out.segment = std::move(seg).value();
      auto model = Model::load(out.segment->gguf());
      if (!model) return model.status();
      out.model = std::move(model).value();
      return out;
    }
    // Too large for a resident copy: map the file instead (slower decode, but it runs, as llama.cpp's).
    if (seg.status().code() != Code::kOutOfRange) return seg.status();
    out.note = seg.status().message();
  }
  {
    auto model = Model::open(path);
    if (!model) return model.status();
    out.model = std::move(model).value();
  }
  return out;
}

Result<Session> open_session(const std::string& path, WeightsSource source, const EngineOptions& options,
                             bool with_tokenizer) {
  Session s;
  auto loaded = open_model(path, source);
  if (!loaded) return loaded.status();
  s.loaded = std::move(loaded).value();
  if (with_tokenizer) {
    auto tok = Tokenizer::from_gguf(s.loaded.model->file());
    if (!tok) return tok.status();
    s.tokenizer = std::move(tok).value();
  }
  auto engine = Engine::create(s.loaded.model, options);
  if (!engine) return engine.status();
  s.engine = std::move(engine).value();
  return s;
}

}  // namespace inferd::cli
