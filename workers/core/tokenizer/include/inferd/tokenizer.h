// inferd/tokenizer.h — text <-> token ids, exactly as llama.cpp's llama_tokenize / llama_token_to_piece.
//
// Two vocabulary kinds are supported: byte-level BPE (`tokenizer.ggml.model` = "gpt2") with the
// pre-tokenizers named by `tokenizer.ggml.pre` ("default", "gpt-2" and its aliases, the llama3 family
// ("llama-bpe", "llama3", ...), the smollm/starcoder family, the qwen2 family, "falcon"), and
// SentencePiece-style BPE (`tokenizer.ggml.model` = "llama": score-ordered merges, <0xXX> byte
// fallback, "▁" for spaces). Other models or pre-tokenizers are rejected with kUnimplemented; an
// unknown pre-tokenizer name falls back to "default", as llama.cpp does.
//
// As in llama.cpp, GGUF strings (token texts, merges, names) end at their first NUL byte, and an
// empty token text becomes "[EMPTY_<id>]".
//
// Deliberate differences from llama.cpp, all on input llama.cpp itself cannot handle (it throws):
// UTF-8 sequences decoding past U+10FFFF become U+FFFD; an SPM byte without a byte token becomes the
// unknown token (or nothing); token ids outside the vocabulary render as "".
//
// Thread safety: a Tokenizer is immutable after construction; all const methods may be called from
// any number of threads at once. A Utf8Stream is a value owned by one caller (not thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "inferd/status.h"

namespace inferd {

namespace gguf {
class GgufFile;
}

// llama.cpp's token types (the GGUF `tokenizer.ggml.token_type` values).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Everything the tokenizer needs from a model's metadata. Ids are the raw metadata values; -1 means
// the key is absent (the vocabulary kind's default applies), and an id outside the vocabulary is
// ignored as llama.cpp does.
struct TokenizerConfig {
  std::string model;                 // tokenizer.ggml.model: "gpt2" or "llama"
  std::string pre;                   // tokenizer.ggml.pre; "" when absent
  std::string model_name;            // general.name; "" when absent (llama.cpp keys Phi-3's token attributes on it)
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<float> scores;         // tokenizer.ggml.scores; empty = all 0
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (TokenType values); empty = all normal
  std::vector<std::string> merges;   // tokenizer.ggml.merges ("left right"), BPE only
  int64_t bos_id = -1, eos_id = -1, eot_id = -1, eom_id = -1, unk_id = -1, sep_id = -1, pad_id = -1;
  int64_t fim_pre_id = -1, fim_suf_id = -1, fim_mid_id = -1, fim_pad_id = -1, fim_rep_id = -1,
          fim_sep_id = -1;
  // tokenizer.ggml.add_bos_token / add_eos_token / add_space_prefix: -1 absent, 0 false, 1 true.
  int add_bos = -1, add_eos = -1, add_space_prefix = -1;

  // Reads the tokenizer.ggml.* keys. kNotFound without a vocabulary, kCorrupt for mistyped keys or
  // per-token arrays whose length differs from the token list's.
  static Result<TokenizerConfig> from_gguf(const gguf::GgufFile& file);
};

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const gguf::GgufFile& file);
  // kInvalidArgument for an empty vocabulary or mismatched array lengths, kUnimplemented for an
  // unsupported model or pre-tokenizer.
  static Result<std::unique_ptr<Tokenizer>> from_config(TokenizerConfig config);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // As llama_tokenize(text, add_special, parse_special): add_special adds BOS/EOS as the model's
  // metadata says; parse_special recognises control token texts (e.g. "<|im_start|>") inside the
  // text. User-defined tokens are always recognised.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // The raw bytes of a token, as llama_token_to_piece(id, lstrip = 0, special): control and unknown
  // tokens render as "" unless `special`.
  std::string token_to_piece(int32_t id, bool special = false) const;
  // As llama_detokenize(ids, remove_special = false, unparse_special = special), including the SPM
  // leading-space removal and the model's space clean-up (off for smollm, qwen2 and SPM).
  std::string decode(std::span<const int32_t> ids, bool special = false) const;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos() const { return bos_; }  // -1 if none
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  bool is_eog(int32_t id) const;  // end of generation (eos, eot, <|im_end|>, ...) as llama.cpp
  bool is_control(int32_t id) const;
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  std::string_view token_text(int32_t id) const;  // "" for an id outside the vocabulary
  // The id of a token by its exact text, or -1.
  int32_t token_id(std::string_view text) const;

 private:
  struct TokenData {
    std::string text;
    float score = 0.0f;
    uint32_t attr = 0;  // llama_token_attr bits
  };
  struct Fragment {
    bool is_token;
    int32_t id;  // when is_token
    size_t offset, length;  // into the encoded text otherwise
  };
  enum class Kind { kBpe, kSpm };

  Tokenizer() = default;
  Status init(TokenizerConfig config);
  void detect_special_tokens(const TokenizerConfig& config);
  std::string make_piece(int32_t id) const;
  void partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;
  void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
  void encode_spm(std::string_view text, std::vector<int32_t>& out) const;
  int32_t find(std::string_view text) const;
  int merge_rank(std::string_view left, std::string_view right, std::string& key) const;

  Kind kind_ = Kind::kBpe;
  std::vector<TokenData> tokens_;
  // Built by inserting texts in id order, like llama.cpp's token_to_id: its iteration order decides
  // which token wins the text-based detection of EOT and FIM tokens when several match.
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::unordered_map<std::string, int32_t> merge_ranks_;  // key: left + '\xff' + right
  std::vector<int32_t> special_tokens_;  // control/user-defined/unknown, longest text first
  std::vector<std::string> pieces_;      // token_to_piece(id, special = true)
  std::vector<uint8_t> eog_;             // per id
  std::vector<uint8_t> pre_steps_;       // pretok::Step values
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, eom_ = -1, unk_ = -1;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
  bool ignore_merges_ = false, clean_spaces_ = false;
};

// Streams detokenized text so that only complete UTF-8 sequences are emitted; invalid bytes become
// U+FFFD (one per maximal invalid subpart, as the Unicode standard recommends) at flush() or as soon
// as they can no longer start a valid sequence.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string pending_;  // at most 3 bytes: the start of an incomplete sequence
};

}  // namespace inferd
