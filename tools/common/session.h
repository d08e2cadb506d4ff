// tools/common/session.h — what the in-process tools open: a model, its tokenizer and an engine.
// Thread safety: single-threaded use at start-up.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "inferd/engine.h"
#include "inferd/ipc/weights_segment.h"
#include "inferd/status.h"
#include "inferd/tokenizer.h"

namespace inferd::cli {

// Where the in-process tools keep the weights.
//  kShared: copied into a sealed memfd backed by 2 MiB pages, exactly as the daemon does for its
//           workers (ipc::WeightsSegment), so the tools measure what the daemon runs. The default.
//  kFileMap: the GGUF file mapped in place (page cache, 4 KiB pages unless the file system gives
//           large folios), as llama.cpp does by default; no copy, faster start, slower decode.
enum class WeightsSource { kShared, kFileMap };
inline constexpr const char* kWeightsHelp =
    "where the weights live: shm (a copy in shared memory with 2 MiB pages, as in the daemon) or "
    "mmap (the file mapped in place)";
Result<WeightsSource> parse_weights_source(std::string_view name);  // "shm" or "mmap"

struct LoadedModel {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const ipc::WeightsSegment> segment;  // null for kFileMap
  std::string note;  // why kShared fell back to the file mapping (the model exceeds MemAvailable)
  // "shared memory, 604 of 606 MiB in 2 MiB pages" or "file mapping".
  std::string describe_weights() const;
};
Result<LoadedModel> open_model(const std::string& path, WeightsSource source);

struct Session {
  LoadedModel loaded;
  std::unique_ptr<Tokenizer> tokenizer;  // null unless requested
  std::unique_ptr<Engine> engine;
};

// Opens the model at `path`, its tokenizer when `with_tokenizer`, and an engine with `options`.
Result<Session> open_session(const std::string& path, WeightsSource source, const EngineOptions& options,
                             bool with_tokenizer);

}  // namespace inferd::cli
