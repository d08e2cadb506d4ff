// The GGUF adapter: reads tokenizer.ggml.* keys into a TokenizerConfig (kept apart from the
// tokenizer proper so that it can be built and tested without model files).
#include "inferd/gguf.h"
#include "inferd/tokenizer.h"

namespace inferd {
namespace {

Status read_id(const gguf::GgufFile& file, std::string_view key, int64_t& id) {
  if (!file.has_key(key)) return Status::ok();
  auto v = file.get_u32(key);
  if (!v.is_ok()) return v.status();
  id = *v;
  return Status::ok();
}

Status read_flag(const gguf::GgufFile& file, std::string_view key, int& flag) {
  if (!file.has_key(key)) return Status::ok();
  auto v = file.get_bool(key);
  if (!v.is_ok()) return v.status();
  flag = *v ? 1 : 0;
  return Status::ok();
}

}  // namespace

Result<TokenizerConfig> TokenizerConfig::from_gguf(const gguf::GgufFile& file) {
  TokenizerConfig c;
  auto model = file.get_string("tokenizer.ggml.model");
  if (!model.is_ok()) return model.status().with_context("tokenizer");
  c.model = std::string(*model);
  if (file.has_key("tokenizer.ggml.pre")) {
    auto pre = file.get_string("tokenizer.ggml.pre");
    if (!pre.is_ok()) return pre.status();
    c.pre = std::string(*pre);
  }
  if (file.has_key("general.name")) {
    auto name = file.get_string("general.name");
    if (name.is_ok()) c.model_name = std::string(*name);  // informational: a mistyped name is not fatal
  }
  auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens.is_ok()) return tokens.status().with_context("tokenizer");
  c.tokens.assign(tokens->begin(), tokens->end());
  const size_t n = c.tokens.size();
  if (file.has_key("tokenizer.ggml.scores")) {
    auto scores = file.get_f32_array("tokenizer.ggml.scores");
    if (!scores.is_ok()) return scores.status();
    c.scores = std::move(*scores);
    if (c.scores.size() != n) {
      return make_error(Code::kCorrupt, "%s: tokenizer.ggml.scores has %zu entries for %zu tokens",
                        file.path().c_str(), c.scores.size(), n);
    }
  }
  if (file.has_key("tokenizer.ggml.token_type")) {
    auto types = file.get_i32_array("tokenizer.ggml.token_type");
    if (!types.is_ok()) return types.status();
    c.token_types = std::move(*types);
    if (c.token_types.size() != n) {
      return make_error(Code::kCorrupt, "%s: tokenizer.ggml.token_type has %zu entries for %zu tokens",
                        file.path().c_str(), c.token_types.size(), n);
    }
  }
  if (c.model == "gpt2") {
    auto merges = file.get_string_array("tokenizer.ggml.merges");
    if (!merges.is_ok()) return merges.status().with_context("tokenizer (gpt2 needs merges)");
    c.merges.assign(merges->begin(), merges->end());
  }
  const std::pair<const char*, int64_t*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &c.bos_id},
      {"tokenizer.ggml.eos_token_id", &c.eos_id},
      {"tokenizer.ggml.eot_token_id", &c.eot_id},
      {"tokenizer.ggml.eom_token_id", &c.eom_id},
      {"tokenizer.ggml.unknown_token_id", &c.unk_id},
      {"tokenizer.ggml.seperator_token_id", &c.sep_id},  // sic: llama.cpp's key
      {"tokenizer.ggml.padding_token_id", &c.pad_id},
      {"tokenizer.ggml.fim_pre_token_id", &c.fim_pre_id},
      {"tokenizer.ggml.fim_suf_token_id", &c.fim_suf_id},
      {"tokenizer.ggml.fim_mid_token_id", &c.fim_mid_id},
      {"tokenizer.ggml.fim_pad_token_id", &c.fim_pad_id},
      {"tokenizer.ggml.fim_rep_token_id", &c.fim_rep_id},
      {"tokenizer.ggml.fim_sep_token_id", &c.fim_sep_id},
      // Deprecated names, read last so that they win, as in llama.cpp.
      {"tokenizer.ggml.prefix_token_id", &c.fim_pre_id},
      {"tokenizer.ggml.suffix_token_id", &c.fim_suf_id},
      {"tokenizer.ggml.middle_token_id", &c.fim_mid_id},
  };
  for (const auto& [key, id] : ids) {
    // An id outside the vocabulary is ignored later, as llama.cpp does (it warns).
    INFERD_RETURN_IF_ERROR(read_id(file, key, *id));
  }
  INFERD_RETURN_IF_ERROR(read_flag(file, "tokenizer.ggml.add_bos_token", c.add_bos));
  INFERD_RETURN_IF_ERROR(read_flag(file, "tokenizer.ggml.add_eos_token", c.add_eos));
  INFERD_RETURN_IF_ERROR(read_flag(file, "tokenizer.ggml.add_space_prefix", c.add_space_prefix));
  return c;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  auto config = TokenizerConfig::from_gguf(file);
  if (!config.is_ok()) return config.status();
  return from_config(std::move(*config));
}

}  // namespace inferd
