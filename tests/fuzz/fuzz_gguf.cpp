// libFuzzer target: the GGUF reader, the model loader and the graph builder on arbitrary bytes. Every input must end in a
// value or a clear error; ASan/UBSan report anything else.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "inferd/gguf.h"
#include "inferd/graph_builder.h"
#include "inferd/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  auto file = inferd::gguf::GgufFile::from_buffer(std::move(bytes), "fuzz.gguf");
  if (!file) return 0;
  std::shared_ptr<const inferd::gguf::GgufFile> shared(std::move(file).value());
  for (const auto& key : shared->keys()) (void)shared->get_string(key);
  auto model = inferd::Model::load(shared);
  if (model) (void)inferd::graph::build_forward(**model);  // shapes from the metadata must build a valid graph
  return 0;
}
