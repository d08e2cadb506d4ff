#include "inferd/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <queue>
#include <unordered_set>

#include "pretokenize.h"
#include "unicode.h"

namespace inferd {
namespace {

// llama_token_attr bits.
constexpr uint32_t kAttrUnknown = 1u << 0;
constexpr uint32_t kAttrUnused = 1u << 1;
constexpr uint32_t kAttrNormal = 1u << 2;
constexpr uint32_t kAttrControl = 1u << 3;
constexpr uint32_t kAttrUserDefined = 1u << 4;
constexpr uint32_t kAttrByte = 1u << 5;
constexpr uint32_t kAttrRstrip = 1u << 8;  // whitespace after the token, in text parsed for special tokens, is dropped

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

uint32_t attr_from_type(int32_t type) {
  switch (static_cast<TokenType>(type)) {
    case TokenType::kUnknown: return kAttrUnknown;
    case TokenType::kUnused: return kAttrUnused;
    case TokenType::kNormal: return kAttrNormal;
    case TokenType::kControl: return kAttrControl;
    case TokenType::kUserDefined: return kAttrUserDefined;
    case TokenType::kByte: return kAttrByte;
    default: return 0;
  }
}

// GPT-2's reversible byte <-> printable code point mapping.
struct ByteMap {
  std::string byte_to_utf8[256];
  int16_t cpt_to_byte[512];  // every mapped code point is < 512; -1 where unmapped

  ByteMap() {
    std::fill(std::begin(cpt_to_byte), std::end(cpt_to_byte), int16_t{-1});
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? b : next++;
      unicode::append_utf8(cp, byte_to_utf8[b]);
      cpt_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

struct PreSpec {
  std::vector<pretok::Step> steps;
  bool ignore_merges = false;
  bool add_bos = false;
  bool clean_spaces = true;
  bool no_bos = false;
};

// llama.cpp's tokenizer.ggml.pre names for the pre-tokenizers implemented here.
Result<PreSpec> pre_spec(const std::string& name) {
  using pretok::Step;
  auto in = [&](std::initializer_list<std::string_view> names) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  PreSpec s;
  if (in({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"})) {
    s.steps = {Step::kLlama3};
    s.ignore_merges = true;
    s.add_bos = true;
  } else if (in({"dbrx", "smaug-bpe"})) {
    s.steps = {Step::kLlama3};
  } else if (in({"glm4", "chatglm-bpe"})) {
    s.steps = {Step::kLlama3};
    s.no_bos = true;
  } else if (in({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                 "mellum", "exaone4", "mpt", "olmo", "jais"})) {
    s.steps = {Step::kGpt2};
  } else if (in({"trillion", "granite-docling"})) {
    s.steps = {Step::kGpt2};
    s.clean_spaces = false;
  } else if (in({"starcoder", "refact", "codeshell", "exaone", "minerva-7b"})) {
    s.steps = {Step::kEachNumber, Step::kGpt2};
  } else if (in({"smollm", "command-r"})) {
    s.steps = {Step::kEachNumber, Step::kGpt2};
    s.clean_spaces = false;
  } else if (in({"qwen2", "deepseek-r1-qwen", "kormo", "hunyuan", "grok-2"})) {
    s.steps = {Step::kQwen2};
    s.clean_spaces = false;
  } else if (in({"stablelm2", "megrez"})) {
    s.steps = {Step::kQwen2};
  } else if (in({"falcon"})) {
    s.steps = {Step::kPunctRunsTick, Step::kGpt2, Step::kAsciiDigits3};
  } else if (in({"deepseek-llm", "deepseek-coder", "deepseek-v3", "hunyuan-dense", "poro-chat", "bloom",
                 "gpt3-finnish", "viking", "tekken", "chameleon", "gpt-4o", "llama4", "minimax-m2",
                 "superbpe", "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder", "kimi-k2", "afmoe",
                 "jina-v1-en", "jina-v2-code", "roberta-bpe"})) {
    return make_error(Code::kUnimplemented, "pre-tokenizer '%s' is not supported", name.c_str());
  } else {
    // "default", absent, or a name llama.cpp does not know either.
    s.steps = {Step::kPunctRuns, Step::kGpt2, Step::kNumberRuns, Step::kAsciiDigits3};
  }
  return s;
}

// llama.cpp reads GGUF strings as C strings: everything from a NUL byte on is lost.
void truncate_at_nul(std::string& s) {
  const size_t nul = s.find('\0');
  if (nul != std::string::npos) s.resize(nul);
}

bool text_in(std::string_view text, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), text) != list.end();
}

}  // namespace

Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_config(TokenizerConfig config) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  Status st = t->init(std::move(config));
  if (!st.is_ok()) return st;
  return t;
}

Status Tokenizer::init(TokenizerConfig config) {
  truncate_at_nul(config.model);
  truncate_at_nul(config.pre);
  const size_t n = config.tokens.size();
  if (n == 0) return Status(Code::kInvalidArgument, "tokenizer: empty vocabulary");
  if (n > static_cast<size_t>(INT32_MAX)) return Status(Code::kInvalidArgument, "tokenizer: vocabulary too large");
  if (!config.scores.empty() && config.scores.size() != n) {
    return make_error(Code::kInvalidArgument, "tokenizer: %zu scores for %zu tokens", config.scores.size(), n);
  }
  if (!config.token_types.empty() && config.token_types.size() != n) {
    return make_error(Code::kInvalidArgument, "tokenizer: %zu token types for %zu tokens",
                      config.token_types.size(), n);
  }

  if (config.model == "gpt2") {
    kind_ = Kind::kBpe;
    bos_ = 11;
    eos_ = 11;
    unk_ = -1;
    add_space_prefix_ = false;
    clean_spaces_ = true;
    auto spec = pre_spec(config.pre);
    if (!spec.is_ok()) return spec.status();
    for (const pretok::Step step : spec->steps) pre_steps_.push_back(static_cast<uint8_t>(step));
    ignore_merges_ = spec->ignore_merges;
    add_bos_ = spec->add_bos;
    clean_spaces_ = spec->clean_spaces;
    if (spec->no_bos) bos_ = -1;
  } else if (config.model == "llama") {
    kind_ = Kind::kSpm;
    bos_ = 1;
    eos_ = 2;
    unk_ = 0;
    add_space_prefix_ = true;
    clean_spaces_ = false;
    add_bos_ = true;
    add_eos_ = false;
  } else {
    return make_error(Code::kUnimplemented, "tokenizer model '%s' is not supported", config.model.c_str());
  }
  if (config.add_space_prefix >= 0) add_space_prefix_ = config.add_space_prefix != 0;

  tokens_.resize(n);
  token_to_id_.clear();
  for (size_t i = 0; i < n; ++i) {
    TokenData& td = tokens_[i];
    td.text = std::move(config.tokens[i]);
    truncate_at_nul(td.text);
    if (td.text.empty()) td.text = "[EMPTY_" + std::to_string(i) + "]";
    token_to_id_[td.text] = static_cast<int32_t>(i);
    td.score = config.scores.empty() ? 0.0f : config.scores[i];
    td.attr = config.token_types.empty() ? kAttrNormal : attr_from_type(config.token_types[i]);
  }

  if (kind_ == Kind::kBpe) {
    merge_ranks_.reserve(config.merges.size());
    std::string key;
    for (size_t i = 0; i < config.merges.size(); ++i) {
      std::string& m = config.merges[i];
      truncate_at_nul(m);
      const size_t pos = m.find(' ', 1);
      key.clear();
      if (pos != std::string::npos) {
        key.append(m, 0, pos);
        key.push_back('\xff');
        key.append(m, pos + 1);
      } else {
        key.push_back('\xff');
      }
      merge_ranks_.emplace(key, static_cast<int32_t>(i));
    }
  }

  auto set_id = [&](int64_t value, int32_t& id) {
    if (value >= 0 && value < static_cast<int64_t>(n)) id = static_cast<int32_t>(value);
  };
  set_id(config.bos_id, bos_);
  set_id(config.eos_id, eos_);
  set_id(config.eot_id, eot_);
  set_id(config.eom_id, eom_);
  set_id(config.unk_id, unk_);
  if (config.add_bos >= 0) add_bos_ = config.add_bos != 0;
  if (config.add_eos >= 0) add_eos_ = config.add_eos != 0;
  // Kind defaults can point past a tiny vocabulary.
  for (int32_t* id : {&bos_, &eos_, &unk_}) {
    if (*id >= static_cast<int32_t>(n)) *id = -1;
  }

  detect_special_tokens(config);

  for (int32_t id = 0; id < static_cast<int32_t>(n); ++id) {
    if (tokens_[id].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) special_tokens_.push_back(id);
  }
  // Not stable, exactly like llama.cpp (same algorithm and input order give the same order).
  std::sort(special_tokens_.begin(), special_tokens_.end(),
            [&](int32_t a, int32_t b) { return tokens_[a].text.size() > tokens_[b].text.size(); });
  // Phi-3 (recognised by name, as llama.cpp does: "phi-3" or "phi3" in general.name, any case): every special
  // token and </s> eat the whitespace after them, except <unk>, <s> and <|endoftext|>. Its chat template's
  // "<|user|>\n" then tokenizes as the model was trained.
  std::string lower_name = config.model_name;
  for (char& ch : lower_name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower_name.find("phi-3") != std::string::npos || lower_name.find("phi3") != std::string::npos) {
    for (const int32_t id : special_tokens_) tokens_[id].attr |= kAttrRstrip;
    auto set_rstrip = [&](const char* text, bool on) {
      const auto it = token_to_id_.find(text);
      if (it == token_to_id_.end()) return;
      tokens_[it->second].attr = on ? tokens_[it->second].attr | kAttrRstrip : tokens_[it->second].attr & ~kAttrRstrip;
    };
    set_rstrip("</s>", true);
    for (const char* text : {"<unk>", "<s>", "<|endoftext|>"}) set_rstrip(text, false);
  }

  pieces_.resize(n);
  for (int32_t id = 0; id < static_cast<int32_t>(n); ++id) pieces_[id] = make_piece(id);
  return Status::ok();
}

void Tokenizer::detect_special_tokens(const TokenizerConfig& config) {
  const int32_t n = n_vocab();
  int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  auto set_id = [&](int64_t value, int32_t& id) {
    if (value >= 0 && value < n) id = static_cast<int32_t>(value);
  };
  set_id(config.fim_pre_id, fim_pre);
  set_id(config.fim_suf_id, fim_suf);
  set_id(config.fim_mid_id, fim_mid);
  set_id(config.fim_pad_id, fim_pad);
  set_id(config.fim_rep_id, fim_rep);
  set_id(config.fim_sep_id, fim_sep);

  auto make_control = [&](int32_t id) {
    if ((tokens_[id].attr & kAttrControl) == 0) tokens_[id].attr = kAttrControl;
  };
  auto detect = [&](int32_t& slot, const std::string& text, int32_t id,
                    std::initializer_list<std::string_view> names) {
    if (slot == -1 && text_in(text, names)) {
      slot = id;
      make_control(id);
    }
  };
  // llama.cpp scans its token map in hash order; the first match of each kind wins.
  for (const auto& [text, id] : token_to_id_) {
    detect(eot_, text, id,
           {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
            "_<EOT>", "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "<end_of_utterance>"});
    detect(eom_, text, id, {"<|eom_id|>"});
    detect(fim_pre, text, id,
           {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>",
            "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>"});
    detect(fim_suf, text, id,
           {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
            "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>"});
    detect(fim_mid, text, id,
           {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>",
            "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>"});
    detect(fim_pad, text, id, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"});
    detect(fim_rep, text, id, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
    detect(fim_sep, text, id, {"<|file_sep|>"});
  }

  eog_.assign(n, 0);
  for (const int32_t id : {fim_pad, fim_rep, fim_sep}) {
    if (id >= 0) eog_[id] = 1;
  }
  for (const auto& [text, id] : token_to_id_) {
    if (text_in(text, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                       "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                       "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                       "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "[e~["})) {
      eog_[id] = 1;
      make_control(id);
    }
  }
  // gpt-oss: these must always render.
  for (const auto& [text, id] : token_to_id_) {
    if (text_in(text, {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})) tokens_[id].attr = kAttrUserDefined;
  }
  for (const int32_t id : {eos_, eot_, eom_}) {
    if (id >= 0) eog_[id] = 1;
  }
  // o200k_harmony and solar-open: with <|return|> and <|call|> (or <|calls|> and <|flush|>) present, <|end|>
  // does not end generation. gemma4 and plamo: with <|tool_response>/<|plamo:eos|>, </s> is a normal token.
  int32_t end_id = -1, s_id = -1;
  bool has_return = false, has_call = false, has_flush = false, normal_s = false;
  for (int32_t id = 0; id < n; ++id) {
    if (!eog_[id]) continue;
    const std::string& text = tokens_[id].text;
    if (text == "<|return|>") has_return = true;
    else if (text == "<|call|>" || text == "<|calls|>") has_call = true;
    else if (text == "<|flush|>") has_flush = true;
    else if (text == "<|end|>") end_id = id;
    if (text == "<|tool_response>" || text == "<|plamo:eos|>") normal_s = true;
    else if (text == "</s>") s_id = id;
  }
  if (((has_return && has_call) || (has_call && has_flush)) && end_id >= 0) {
    eog_[end_id] = 0;
    tokens_[end_id].attr = kAttrUserDefined;
  }
  if (normal_s && s_id >= 0) {
    eog_[s_id] = 0;
    tokens_[s_id].attr = kAttrNormal;
  }
}

std::string Tokenizer::make_piece(int32_t id) const {
  const TokenData& td = tokens_[id];
  if (td.attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return td.text;
  std::string out;
  if (kind_ == Kind::kSpm) {
    if (td.attr & kAttrNormal) {
      size_t pos = 0;
      while (pos < td.text.size()) {
        const size_t hit = td.text.find(kSpmSpace, pos);
        if (hit == std::string::npos) {
          out.append(td.text, pos);
          break;
        }
        out.append(td.text, pos, hit - pos);
        out.push_back(' ');
        pos = hit + kSpmSpace.size();
      }
    } else if (td.attr & kAttrByte) {
      const std::string hex = td.text.size() >= 3 ? td.text.substr(3, 2) : std::string();
      out.push_back(static_cast<char>(std::strtol(hex.c_str(), nullptr, 16)));
    }
    return out;
  }
  if (td.attr & kAttrNormal) {
    const ByteMap& bm = byte_map();
    std::vector<uint32_t> cpts;
    unicode::decode_utf8(td.text, cpts);
    for (const uint32_t cp : cpts) {
      if (cp < 512 && bm.cpt_to_byte[cp] >= 0) {
        out.push_back(static_cast<char>(bm.cpt_to_byte[cp]));
      } else {
        std::string utf8;
        unicode::append_utf8(cp, utf8);
        out += "[UNK_BYTE_0x";
        for (const char c : utf8) {
          char buf[3];
          std::snprintf(buf, sizeof(buf), "%02x", static_cast<uint8_t>(c));
          out += buf;
        }
        out += td.text + "]";
      }
    }
  }
  return out;
}

int32_t Tokenizer::find(std::string_view text) const {
  // std::unordered_map<std::string, ...>::find needs a std::string in C++20 (no transparent hash
  // for it in libstdc++ 12), so one short-lived copy per lookup.
  const auto it = token_to_id_.find(std::string(text));
  return it == token_to_id_.end() ? -1 : it->second;
}

int32_t Tokenizer::token_id(std::string_view text) const { return find(text); }

int Tokenizer::merge_rank(std::string_view left, std::string_view right, std::string& key) const {
  key.assign(left);
  key.push_back('\xff');
  key.append(right);
  const auto it = merge_ranks_.find(key);
  return it == merge_ranks_.end() ? -1 : it->second;
}

void Tokenizer::partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const {
  out.clear();
  if (text.empty()) return;
  out.push_back({false, -1, 0, text.size()});
  std::vector<Fragment> next;
  for (const int32_t id : special_tokens_) {
    const TokenData& td = tokens_[id];
    if (!parse_special && (td.attr & (kAttrControl | kAttrUnknown))) continue;
    const std::string_view special = td.text;
    next.clear();
    for (const Fragment& f : out) {
      if (f.is_token) {
        next.push_back(f);
        continue;
      }
      size_t off = f.offset, len = f.length;
      while (len > 0) {
        const size_t match = text.substr(0, off + len).find(special, off);
        if (match == std::string_view::npos) break;
        if (match > off) next.push_back({false, -1, off, match - off});
        next.push_back({true, id, 0, 0});
        const size_t end = match + special.size();
        len = off + len - end;
        off = end;
        if (td.attr & kAttrRstrip) {
          while (len > 0 && std::isspace(static_cast<unsigned char>(text[off]))) {
            ++off;
            --len;
          }
        }
      }
      if (len > 0) next.push_back({false, -1, off, len});
    }
    out.swap(next);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  std::vector<Fragment> fragments;
  partition(text, parse_special, fragments);
  if (kind_ == Kind::kBpe) {
    if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
    for (const Fragment& f : fragments) {
      if (f.is_token) {
        out.push_back(f.id);
      } else {
        encode_bpe(text.substr(f.offset, f.length), out);
      }
    }
    if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
    return out;
  }
  bool prev_special = true;  // the first text gets the space prefix
  if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
  std::string escaped;
  for (const Fragment& f : fragments) {
    if (f.is_token) {
      out.push_back(f.id);
      prev_special = true;
      continue;
    }
    escaped.clear();
    if (add_space_prefix_ && prev_special) escaped.append(kSpmSpace);
    for (const char c : text.substr(f.offset, f.length)) {
      if (c == ' ') {
        escaped.append(kSpmSpace);
      } else {
        escaped.push_back(c);
      }
    }
    encode_spm(escaped, out);
    prev_special = false;
  }
  if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
  return out;
}

namespace {

struct Symbol {
  int prev, next;
  size_t offset, n;  // bytes of the word; n == 0 once merged into its left neighbour
};

struct BpeBigram {
  int left, right;
  int rank;
  size_t size;
};
struct BpeOrder {
  bool operator()(const BpeBigram& l, const BpeBigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

struct SpmBigram {
  int left, right;
  float score;
  size_t size;
};
struct SpmOrder {
  bool operator()(const SpmBigram& l, const SpmBigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

// Repeatedly merges the best queued bigram of adjacent symbols (BPE: lowest rank; SPM: highest
// score), re-queueing the merged symbol's new neighbours through `add_bigram`.
template <typename Queue, typename AddBigram>
void merge_best_bigrams(std::vector<Symbol>& symbols, Queue& queue, const AddBigram& add_bigram) {
  while (!queue.empty()) {
    const auto b = queue.top();
    queue.pop();
    Symbol& l = symbols[b.left];
    Symbol& r = symbols[b.right];
    // Stale: one side was merged away or grew since this bigram was queued.
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = b.left;
    add_bigram(l.prev, b.left);
    add_bigram(b.left, l.next);
  }
}

// Splits `word` into symbols of one (possibly truncated) UTF-8 sequence each.
void init_symbols(std::string_view word, std::vector<Symbol>& symbols) {
  symbols.clear();
  size_t offset = 0;
  int index = 0;
  while (offset < word.size()) {
    const size_t len = std::min(word.size() - offset, unicode::utf8_len_from_lead(word[offset]));
    symbols.push_back({index - 1, offset + len == word.size() ? -1 : index + 1, offset, len});
    offset += len;
    ++index;
  }
}

}  // namespace

void Tokenizer::encode_bpe(std::string_view text, std::vector<int32_t>& out) const {
  const ByteMap& bm = byte_map();
  std::vector<uint32_t> cpts;
  cpts.reserve(text.size());
  unicode::decode_utf8(text, cpts);
  std::vector<size_t> lengths;
  std::vector<pretok::Step> steps;
  for (const uint8_t s : pre_steps_) steps.push_back(static_cast<pretok::Step>(s));
  pretok::split(steps, cpts, lengths);

  std::string word, utf8, key;
  std::vector<Symbol> symbols;
  std::priority_queue<BpeBigram, std::vector<BpeBigram>, BpeOrder> queue;
  size_t start = 0;
  for (const size_t len : lengths) {
    word.clear();
    for (size_t i = start; i < start + len; ++i) {
      utf8.clear();
      unicode::append_utf8(cpts[i], utf8);
      for (const char c : utf8) word += bm.byte_to_utf8[static_cast<uint8_t>(c)];
    }
    start += len;

    if (ignore_merges_) {
      const int32_t id = find(word);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
    }
    init_symbols(word, symbols);
    auto view = [&](int i) { return std::string_view(word).substr(symbols[i].offset, symbols[i].n); };
    auto add_bigram = [&](int left, int right) {
      if (left == -1 || right == -1) return;
      const int rank = merge_rank(view(left), view(right), key);
      if (rank < 0) return;
      queue.push({left, right, rank, symbols[left].n + symbols[right].n});
    };
    for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add_bigram(i - 1, i);
    merge_best_bigrams(symbols, queue, add_bigram);
    for (int i = 0; i != -1 && !symbols.empty(); i = symbols[i].next) {
      const std::string_view piece = view(i);
      const int32_t id = find(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (const char c : piece) {
        const int32_t byte_id = find(std::string_view(&c, 1));
        if (byte_id >= 0) out.push_back(byte_id);
      }
    }
  }
}

void Tokenizer::encode_spm(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  init_symbols(text, symbols);
  std::priority_queue<SpmBigram, std::vector<SpmBigram>, SpmOrder> queue;
  auto add_bigram = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const std::string_view joined = text.substr(symbols[left].offset, symbols[left].n + symbols[right].n);
    const int32_t id = find(joined);
    if (id < 0) return;
    queue.push({left, right, tokens_[id].score, joined.size()});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add_bigram(i - 1, i);
  merge_best_bigrams(symbols, queue, add_bigram);
  // Every merged symbol is a token; only single (possibly invalid) characters can be missing, and
  // those fall back to byte tokens.
  for (int i = 0; i != -1 && !symbols.empty(); i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].offset, symbols[i].n);
    const int32_t id = find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (const char c : piece) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      const uint8_t b = static_cast<uint8_t>(c);
      const char name[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
      int32_t byte_id = find(std::string_view(name, 6));
      if (byte_id < 0) byte_id = find(std::string_view(&c, 1));
      if (byte_id < 0) byte_id = unk_;
      if (byte_id >= 0) out.push_back(byte_id);
    }
  }
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  if (id < 0 || id >= n_vocab()) return {};
  if (!special && (tokens_[id].attr & (kAttrUnknown | kAttrControl))) return {};
  return pieces_[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool special) const {
  std::string text;
  bool remove_space = add_space_prefix_;
  for (const int32_t id : ids) {
    std::string piece = token_to_piece(id, special);
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    text += piece;
  }
  if (!clean_spaces_ || text.empty()) return text;

  // llama.cpp's three clean-up passes, in place, including their quirks (the second pass drops the
  // character after a " '" whatever it is).
  int32_t total = static_cast<int32_t>(text.size());
  const int32_t total1 = total;
  total = 1;
  for (int32_t i = 1; i < total1; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
    text[total++] = x;
  }
  const int32_t total2 = total;
  total = total ? 1 : 0;
  for (int32_t i = 1; i < total2; ++i) {
    const char x = text[i];
    if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ') {
      total--;
      text[++i] = '\0';
    }
    text[total++] = x;
  }
  const int32_t total3 = total;
  total = total ? 1 : 0;
  for (int32_t i = 1; i < total3; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = text[i + 1];
      if (x1 == 's' || x1 == 'm') {
        total--;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
        const char x2 = text[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;
      }
    }
    text[total++] = x;
  }
  text.resize(total);
  return text;
}

bool Tokenizer::is_eog(int32_t id) const { return id >= 0 && id < n_vocab() && eog_[id]; }

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < n_vocab() && (tokens_[id].attr & kAttrControl);
}

std::string_view Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return tokens_[id].text;
}

}  // namespace inferd
