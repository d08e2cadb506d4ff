// inferd_tokenizer against llama.cpp: every corpus string under add_special x parse_special, the
// detokenized text, every token's piece, a sweep over all code points, other BPE pre-tokenizers on
// the default model's vocabulary, and a synthetic SentencePiece vocabulary. 100% equality required.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "inferd/gguf.h"
#include "inferd/tokenizer.h"

namespace inferd {
namespace {

using nlohmann::json;

const std::string kModel = std::string(INFERD_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kDataDir = std::string(INFERD_TEST_DATA_DIR) + "/tokenizer";

json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return json();
  return json::parse(in);
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string to_hex(std::string_view s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : s) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

uint64_t fnv1a(std::string_view data, uint64_t h = 0xCBF29CE484222325ull) {
  for (const unsigned char c : data) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

std::string hash_ids(const std::vector<int32_t>& ids) {
  std::string bytes;
  for (const int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<char>((u >> (8 * k)) & 0xFF));
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fnv1a(bytes)));
  return buf;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t min;
    if (b < 0x80) { ++i; continue; }
    if (b >= 0xC2 && b <= 0xDF) { n = 2; min = 0x80; }
    else if (b >= 0xE0 && b <= 0xEF) { n = 3; min = 0x800; }
    else if (b >= 0xF0 && b <= 0xF4) { n = 4; min = 0x10000; }
    else return false;
    if (i + n > s.size()) return false;
    uint32_t cp = b & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// The code point sweep strings of gen_tokenizer_refs.py: every code point in several contexts.
std::string sweep_string(uint32_t start, uint32_t block) {
  std::string s;
  auto put = [&](uint32_t cp) {
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  };
  for (uint32_t cp = start; cp < start + block; ++cp) {
    put('x'); put(cp); put(' '); put(cp); put(cp); put('1'); put(cp); put('\t');
  }
  return s;
}

// Collects mismatches and reports the first few, so one run shows the shape of a regression.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  ~Mismatches() {
    EXPECT_EQ(count_, 0) << count_ << " of " << total_ << " " << what_ << " differ from llama.cpp:\n" << detail_;
  }
  void check(bool ok, const std::string& detail) {
    ++total_;
    if (ok) return;
    if (++count_ <= 8) detail_ += "  " + detail + "\n";
  }

 private:
  std::string what_;
  std::string detail_;
  int count_ = 0, total_ = 0;
};

void check_info(const Tokenizer& tok, const json& refs) {
  EXPECT_EQ(tok.n_vocab(), refs["n_vocab"].get<int>());
  EXPECT_EQ(tok.bos(), refs["bos"].get<int>());
  EXPECT_EQ(tok.eos(), refs["eos"].get<int>());
  EXPECT_EQ(tok.eot(), refs["eot"].get<int>());
  EXPECT_EQ(tok.add_bos(), refs["add_bos"].get<bool>());
  EXPECT_EQ(tok.add_eos(), refs["add_eos"].get<bool>());
  std::vector<int> eog, control;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    if (tok.is_eog(id)) eog.push_back(id);
    if (tok.is_control(id)) control.push_back(id);
  }
  EXPECT_EQ(eog, refs["eog"].get<std::vector<int>>());
  EXPECT_EQ(control, refs["control"].get<std::vector<int>>());
}

void check_pieces(const Tokenizer& tok, const json& refs) {
  const int block = refs["piece_block"].get<int>();
  for (const bool special : {false, true}) {
    const auto& hashes = refs["pieces"][special ? "special" : "plain"];
    Mismatches bad(std::string("piece blocks (special=") + (special ? "true" : "false") + ")");
    for (size_t b = 0; b < hashes.size(); ++b) {
      uint64_t h = 0xCBF29CE484222325ull;
      for (int32_t id = static_cast<int32_t>(b) * block; id < std::min<int32_t>(tok.n_vocab(), (b + 1) * block); ++id) {
        const std::string p = tok.token_to_piece(id, special);
        const uint32_t n = static_cast<uint32_t>(p.size());
        const char len[4] = {static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16),
                             static_cast<char>(n >> 24)};
        h = fnv1a(std::string_view(len, 4), h);
        h = fnv1a(p, h);
      }
      char buf[17];
      std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
      bad.check(hashes[b].get<std::string>() == buf, "ids " + std::to_string(b * block) + "..");
    }
  }
}

void check_cases(const Tokenizer& tok, const json& refs, bool round_trip) {
  Mismatches bad("token id lists");
  Mismatches bad_detok("detokenized texts");
  Mismatches bad_round("round trips");
  for (const auto& c : refs["cases"]) {
    const std::string text = from_hex(c["text"].get<std::string>());
    for (const int a : {0, 1}) {
      for (const int p : {0, 1}) {
        const char key[] = {'a', static_cast<char>('0' + a), 'p', static_cast<char>('0' + p), '\0'};
        const auto want = c[key].get<std::vector<int32_t>>();
        const auto got = tok.encode(text, a != 0, p != 0);
        bad.check(got == want, std::string(key) + " hex " + to_hex(text) + ": got " + ids_str(got) + " want " + ids_str(want));
      }
    }
    const auto ids = c["a1p1"].get<std::vector<int32_t>>();
    const std::string detok = to_hex(tok.decode(ids, false));
    bad_detok.check(detok == c["detok"].get<std::string>(), "hex " + to_hex(text) + ": got " + detok);
    const std::string detok_s = to_hex(tok.decode(ids, true));
    bad_detok.check(detok_s == c["detok_special"].get<std::string>(), "special, hex " + to_hex(text) + ": got " + detok_s);
    if (round_trip && valid_utf8(text)) {
      const std::string back = tok.decode(tok.encode(text, false, false));
      bad_round.check(back == text, "hex " + to_hex(text) + " -> " + to_hex(back));
    }
  }
}

void check_sweep(const Tokenizer& tok, const json& hashes, uint32_t block, const std::string& what) {
  Mismatches bad("code point sweep blocks (" + what + ")");
  for (size_t b = 0; b < hashes.size(); ++b) {
    const auto ids = tok.encode(sweep_string(static_cast<uint32_t>(b) * block, block), false, false);
    char start[16];
    std::snprintf(start, sizeof(start), "U+%05zX", b * block);
    bad.check(hash_ids(ids) == hashes[b].get<std::string>(), std::string("block at ") + start);
  }
}

class SmolLm2Refs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "model file absent: " << kModel;
    refs_ = load_json(kDataDir + "/smollm2_refs.json");
    ASSERT_FALSE(refs_.is_null()) << "missing " << kDataDir << "/smollm2_refs.json";
    auto file = gguf::GgufFile::open(kModel);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    auto config = TokenizerConfig::from_gguf(**file);
    ASSERT_TRUE(config.is_ok()) << config.status().to_string();
    config_ = *config;
    auto tok = Tokenizer::from_config(config_);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    tok_ = std::move(*tok);
  }
  json refs_;
  TokenizerConfig config_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(SmolLm2Refs, SpecialTokensAndFlags) { check_info(*tok_, refs_); }
TEST_F(SmolLm2Refs, Corpus) { check_cases(*tok_, refs_, /*round_trip=*/true); }
TEST_F(SmolLm2Refs, EveryPiece) { check_pieces(*tok_, refs_); }
TEST_F(SmolLm2Refs, CodePointSweep) {
  check_sweep(*tok_, refs_["sweep"], refs_["sweep_block"].get<uint32_t>(), "smollm");
}

TEST_F(SmolLm2Refs, OtherPreTokenizers) {
  for (const auto& [pre, data] : refs_["pre"].items()) {
    SCOPED_TRACE("pre-tokenizer " + pre);
    TokenizerConfig config = config_;
    config.pre = pre;
    auto tok = Tokenizer::from_config(config);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    Mismatches bad("token id lists (" + pre + ")");
    const auto& ids = data["ids"];
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string text = from_hex(refs_["cases"][i]["text"].get<std::string>());
      const auto want = ids[i].get<std::vector<int32_t>>();
      const auto got = (*tok)->encode(text, false, true);
      bad.check(got == want, "hex " + to_hex(text) + ": got " + ids_str(got) + " want " + ids_str(want));
    }
    check_sweep(**tok, data["sweep"], refs_["sweep_block"].get<uint32_t>(), pre);
  }
}

TEST_F(SmolLm2Refs, GgufAdapterMatchesConfig) {
  auto file = gguf::GgufFile::open(kModel);
  ASSERT_TRUE(file.is_ok());
  auto tok = Tokenizer::from_gguf(**file);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->encode("<|im_start|>user\nHello!<|im_end|>", true, true),
            tok_->encode("<|im_start|>user\nHello!<|im_end|>", true, true));
}

// Gemma 3's SentencePiece vocabulary (262,144 tokens, byte fallback, no space prefix), fetched by
// scripts/setup.sh as the second real model.
const std::string kGemma3Model = std::string(INFERD_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";

class Gemma3Refs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kGemma3Model)) GTEST_SKIP() << "model file absent: " << kGemma3Model;
    refs_ = load_json(kDataDir + "/gemma3_refs.json");
    ASSERT_FALSE(refs_.is_null()) << "missing " << kDataDir << "/gemma3_refs.json";
    auto file = gguf::GgufFile::open(kGemma3Model);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    auto tok = Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    tok_ = std::move(*tok);
  }
  json refs_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Gemma3Refs, SpecialTokensAndFlags) { check_info(*tok_, refs_); }
TEST_F(Gemma3Refs, Corpus) { check_cases(*tok_, refs_, /*round_trip=*/false); }
TEST_F(Gemma3Refs, EveryPiece) { check_pieces(*tok_, refs_); }
TEST_F(Gemma3Refs, CodePointSweep) {
  check_sweep(*tok_, refs_["sweep"], refs_["sweep_block"].get<uint32_t>(), "gemma3");
}

TEST(SpmRefs, SyntheticVocabulary) {
  const json refs = load_json(kDataDir + "/spm_refs.json");
  ASSERT_FALSE(refs.is_null()) << "missing " << kDataDir << "/spm_refs.json";
  auto file = gguf::GgufFile::open(kDataDir + "/spm_vocab.gguf");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  auto tok = Tokenizer::from_gguf(**file);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  check_info(**tok, refs);
  check_cases(**tok, refs, /*round_trip=*/false);
  check_pieces(**tok, refs);
}

}  // namespace
}  // namespace inferd
