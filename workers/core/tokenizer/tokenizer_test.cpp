// Unit tests on small hand-made vocabularies; the differential tests against llama.cpp live in
// tests/tokenizer_refs_test.cpp.
#include "inferd/tokenizer.h"

#include <gtest/gtest.h>

#include <vector>

#include "pretokenize.h"
#include "unicode.h"

namespace inferd {
namespace {

// A byte-level BPE vocabulary: the 256 byte tokens (ids 0..255 in GPT-2 byte order), then merged
// tokens, then "<|im_start|>" (control) and "<tool>" (user-defined).
TokenizerConfig tiny_bpe() {
  TokenizerConfig c;
  c.model = "gpt2";
  c.pre = "gpt-2";
  std::string byte_text[256];
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    unicode::append_utf8(printable ? b : next++, byte_text[b]);
    c.tokens.push_back(byte_text[b]);
  }
  const std::string sp = byte_text[' '];  // "Ġ"
  for (const std::string& t : {std::string("ab"), sp + "a", sp + "ab", std::string("abc")}) c.tokens.push_back(t);
  c.merges = {"a b", sp + " a", sp + "a b", "ab c"};
  c.tokens.push_back("<|im_start|>");
  c.tokens.push_back("<tool>");
  c.token_types.assign(c.tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  c.token_types[c.tokens.size() - 2] = static_cast<int32_t>(TokenType::kControl);
  c.token_types[c.tokens.size() - 1] = static_cast<int32_t>(TokenType::kUserDefined);
  c.bos_id = static_cast<int64_t>(c.tokens.size()) - 2;
  c.eos_id = static_cast<int64_t>(c.tokens.size()) - 2;
  return c;
}

TEST(TokenizerBpe, MergesByRank) {
  auto t = Tokenizer::from_config(tiny_bpe());
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.encode("ab", false, false), (std::vector<int32_t>{256}));
  EXPECT_EQ(tok.encode("abc", false, false), (std::vector<int32_t>{259}));
  // " ab": "a b" (rank 0) wins over "Ġ a" (rank 1), and no merge "Ġ ab" exists.
  EXPECT_EQ(tok.encode(" ab", false, false), (std::vector<int32_t>{' ', 256}));
  EXPECT_EQ(tok.encode(" a", false, false), (std::vector<int32_t>{257}));
  EXPECT_EQ(tok.decode(tok.encode("ab abc x", false, false)), "ab abc x");
}

TEST(TokenizerBpe, SpecialTokens) {
  auto t = Tokenizer::from_config(tiny_bpe());
  ASSERT_TRUE(t.is_ok());
  const Tokenizer& tok = **t;
  const int32_t im_start = tok.token_id("<|im_start|>");
  const int32_t tool = tok.token_id("<tool>");
  auto with = tok.encode("a<|im_start|>b<tool>", false, true);
  EXPECT_EQ(with, (std::vector<int32_t>{'a', im_start, 'b', tool}));
  // Control tokens are plain text without parse_special; user-defined ones never are.
  auto without = tok.encode("<|im_start|><tool>", false, false);
  EXPECT_EQ(without.back(), tool);
  EXPECT_GT(without.size(), 2u);
  EXPECT_EQ(tok.token_to_piece(im_start, false), "");
  EXPECT_EQ(tok.token_to_piece(im_start, true), "<|im_start|>");
  EXPECT_EQ(tok.token_to_piece(tool, false), "<tool>");
  EXPECT_TRUE(tok.is_eog(im_start));  // it is the eos
  EXPECT_FALSE(tok.add_bos());
}

TEST(TokenizerBpe, InvalidUtf8BecomesReplacementCharacter) {
  auto t = Tokenizer::from_config(tiny_bpe());
  ASSERT_TRUE(t.is_ok());
  // U+FFFD = EF BF BD, encoded byte by byte (no merges for it).
  EXPECT_EQ((*t)->encode("\xff", false, false), (std::vector<int32_t>{0xEF, 0xBF, 0xBD}));
  EXPECT_EQ((*t)->decode((*t)->encode("\xc3", false, false)), "\xEF\xBF\xBD");
}

TEST(TokenizerConfigTest, RejectsBadConfigs) {
  TokenizerConfig empty;
  empty.model = "gpt2";
  EXPECT_EQ(Tokenizer::from_config(empty).status().code(), Code::kInvalidArgument);
  auto c = tiny_bpe();
  c.model = "bert";
  EXPECT_EQ(Tokenizer::from_config(c).status().code(), Code::kUnimplemented);
  c = tiny_bpe();
  c.pre = "deepseek-coder";
  EXPECT_EQ(Tokenizer::from_config(c).status().code(), Code::kUnimplemented);
  c = tiny_bpe();
  c.scores = {1.0f};
  EXPECT_EQ(Tokenizer::from_config(c).status().code(), Code::kInvalidArgument);
  c = tiny_bpe();
  c.pre = "no-such-pre";  // falls back to "default" like llama.cpp
  EXPECT_TRUE(Tokenizer::from_config(c).is_ok());
}

TokenizerConfig tiny_spm() {
  TokenizerConfig c;
  c.model = "llama";
  c.tokens = {"<unk>", "<s>", "</s>"};
  c.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    c.tokens.push_back(name);
    c.token_types.push_back(static_cast<int32_t>(TokenType::kByte));
  }
  const char* pieces[] = {"\xE2\x96\x81", "h", "e", "l", "o", "\xE2\x96\x81h", "he", "ll", "llo", "hello",
                          "\xE2\x96\x81hello"};
  for (const char* p : pieces) {
    c.tokens.push_back(p);
    c.token_types.push_back(1);
  }
  c.scores.assign(c.tokens.size(), 0.0f);
  for (size_t i = 259; i < c.tokens.size(); ++i) c.scores[i] = -static_cast<float>(c.tokens.size() - i);
  return c;
}

// Phi-3, recognised by its name as llama.cpp recognises it: special tokens (and </s>) drop the whitespace that
// follows them, <s> and <unk> keep it; any other model keeps it everywhere.
TEST(TokenizerSpm, Phi3SpecialTokensEatTheWhitespaceAfterThem) {
  TokenizerConfig c = tiny_spm();
  c.tokens.push_back("<|user|>");
  c.token_types.push_back(static_cast<int32_t>(TokenType::kUserDefined));
  c.scores.push_back(0.0f);
  for (const char* name : {"Phi-3 Mini 4k Instruct", "phi3-small", "Llama 3"}) {
    c.model_name = name;
    auto t = Tokenizer::from_config(c);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    const Tokenizer& tok = **t;
    const int32_t user = tok.token_id("<|user|>");
    const bool phi3 = std::string(name).find("Llama") == std::string::npos;
    const std::vector<int32_t> got = tok.encode("<|user|>\n \thello</s>  hello<s> hello", false, true);
    const int32_t hello = tok.token_id("\xE2\x96\x81hello"), space = tok.token_id("\xE2\x96\x81");
    if (phi3) {
      // Fragments: <|user|>, "hello", </s>, "hello", <s>, " hello"; text after a special token gets the space prefix.
      EXPECT_EQ(got, (std::vector<int32_t>{user, hello, 2, hello, 1, space, hello})) << name;
    } else {
      ASSERT_GT(got.size(), 2u);
      EXPECT_EQ(got.front(), user);
      EXPECT_NE(got[1], hello) << "the newline and the tab stay";
    }
  }
}

TEST(TokenizerSpm, ScoresSpacePrefixAndByteFallback) {
  auto t = Tokenizer::from_config(tiny_spm());
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  const Tokenizer& tok = **t;
  const int32_t hello = tok.token_id("\xE2\x96\x81hello");
  EXPECT_EQ(tok.encode("hello", true, false), (std::vector<int32_t>{1, hello}));
  // "é" has no token: its two bytes.
  EXPECT_EQ(tok.encode("\xC3\xA9", false, false),
            (std::vector<int32_t>{tok.token_id("\xE2\x96\x81"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.decode(tok.encode("hello hello", false, false)), "hello hello");
  EXPECT_EQ(tok.token_to_piece(3 + 'A'), "A");
  EXPECT_TRUE(tok.add_bos());
  EXPECT_TRUE(tok.is_eog(2));
}

TEST(Utf8StreamTest, HoldsIncompleteSequences) {
  Utf8Stream s;
  EXPECT_EQ(s.push("a\xE2\x82"), "a");
  EXPECT_EQ(s.push("\xAC!"), "\xE2\x82\xAC!");
  EXPECT_EQ(s.push("\xF0\x9F"), "");
  EXPECT_EQ(s.push("\x98"), "");
  EXPECT_EQ(s.push("\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.flush(), "");
}

TEST(Utf8StreamTest, ReplacesInvalidBytes) {
  Utf8Stream s;
  EXPECT_EQ(s.push("\xFF" "a"), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(s.push("\xE2\x82" "b"), "\xEF\xBF\xBD" "b");  // truncated sequence: one U+FFFD
  EXPECT_EQ(s.push("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(s.push("\xC3"), "");
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(s.flush(), "");
}

// Arbitrary bytes never crash either tokenizer, and a stream always emits valid UTF-8.
TEST(TokenizerFuzz, RandomBytes) {
  auto bpe = Tokenizer::from_config(tiny_bpe());
  auto spm = Tokenizer::from_config(tiny_spm());
  ASSERT_TRUE(bpe.is_ok() && spm.is_ok());
  uint64_t state = 0x9E3779B97F4A7C15ull;  // fixed seed
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text(next() % 40, '\0');
    for (char& c : text) c = static_cast<char>(next());
    if (iter % 3 == 0) text += "<|im_start|>";
    for (const auto* tok : {bpe->get(), spm->get()}) {
      const auto ids = tok->encode(text, true, true);
      for (const int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->n_vocab());
      Utf8Stream stream;
      std::string out = stream.push(tok->decode(ids));
      out += stream.flush();
      std::vector<uint32_t> cpts;
      unicode::decode_utf8(out, cpts);
      std::string reencoded;
      for (const uint32_t cp : cpts) unicode::append_utf8(cp, reencoded);
      ASSERT_EQ(reencoded, out);
    }
  }
}

std::vector<size_t> split(std::vector<pretok::Step> steps, std::string_view text) {
  std::vector<uint32_t> cpts;
  unicode::decode_utf8(text, cpts);
  std::vector<size_t> lengths;
  pretok::split(steps, cpts, lengths);
  return lengths;
}

TEST(PreTokenizer, Gpt2AndSmollm) {
  using pretok::Step;
  // "Hello", " world", "'s", "  " (space run minus one), " 123", "!"
  EXPECT_EQ(split({Step::kGpt2}, "Hello world's   123!"), (std::vector<size_t>{5, 6, 2, 2, 4, 1}));
  EXPECT_EQ(split({Step::kEachNumber, Step::kGpt2}, "x 123"), (std::vector<size_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(split({Step::kLlama3}, "abc 12345\n\n x"), (std::vector<size_t>{3, 1, 3, 2, 2, 2}));
  EXPECT_EQ(split({Step::kAsciiDigits3}, "1234567a"), (std::vector<size_t>{3, 3, 2}));
}

TEST(Unicode, Classes) {
  EXPECT_TRUE(unicode::cpt_class('a') & unicode::kLetter);
  EXPECT_TRUE(unicode::cpt_class(0x4E2D) & unicode::kLetter);  // 中
  EXPECT_TRUE(unicode::cpt_class(0x0663) & unicode::kNumber);  // Arabic-Indic 3
  EXPECT_TRUE(unicode::cpt_class(0x3000) & unicode::kWhitespace);
  EXPECT_FALSE(unicode::cpt_class(0x1C) & unicode::kWhitespace);
  EXPECT_EQ(unicode::cpt_class(0x110000), 0);
}

}  // namespace
}  // namespace inferd
