// libFuzzer target: the tokenizers (SmolLM2's byte-level BPE, and a SentencePiece vocabulary) on arbitrary
// text, with and without special-token parsing, then decoding what they produced.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "inferd/gguf.h"
#include "inferd/tokenizer.h"

namespace {

std::unique_ptr<inferd::Tokenizer> load(const char* path) {
  auto file = inferd::gguf::GgufFile::open(path);
  if (!file) __builtin_trap();  // the fuzzer's own data is missing: nothing would be tested
  auto tok = inferd::Tokenizer::from_gguf(*file.value());
  if (!tok) __builtin_trap();
  return std::move(tok).value();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<inferd::Tokenizer> bpe = load(INFERD_TEST_DATA_DIR "/models/mixed-small.gguf");
  static const std::unique_ptr<inferd::Tokenizer> spm = load(INFERD_TEST_DATA_DIR "/tokenizer/spm_vocab.gguf");
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const inferd::Tokenizer& tok = (mode & 1) ? *spm : *bpe;
  const auto ids = tok.encode(text, (mode & 2) != 0, (mode & 4) != 0);
  (void)tok.decode(ids, (mode & 8) != 0);
  for (int32_t id : ids) (void)tok.token_to_piece(id, (mode & 8) != 0);
  return 0;
}
