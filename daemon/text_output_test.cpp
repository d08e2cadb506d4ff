#include "text_output.h"

#include <gtest/gtest.h>

namespace inferd::daemon {
namespace {

std::string run(TextOutput& t, const std::vector<std::string>& pieces, std::vector<std::string>* emitted = nullptr) {
  std::string all;
  for (const auto& p : pieces) {
    std::string out = t.push(p);
    if (emitted) emitted->push_back(out);
    all += out;
  }
  return all + t.finish();
}

TEST(TextOutput, PassesTextThroughWithoutStops) {
  TextOutput t;
  EXPECT_EQ(run(t, {"Hello", ",", " world"}), "Hello, world");
  EXPECT_FALSE(t.stopped());
}

TEST(TextOutput, StopStringAcrossPiecesIsCutAndHeldBack) {
  TextOutput t({"\nUser:"});
  std::vector<std::string> emitted;
  EXPECT_EQ(run(t, {"Sure.", "\n", "Us", "er:", " more"}, &emitted), "Sure.");
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(emitted[0], "Sure.");
  EXPECT_EQ(emitted[1], "");  // "\n" might start the stop string
  EXPECT_EQ(emitted[2], "");
}

TEST(TextOutput, HeldPrefixIsReleasedWhenItDoesNotMatch) {
  TextOutput t({"STOP"});
  std::vector<std::string> emitted;
  EXPECT_EQ(run(t, {"ST", "ART"}, &emitted), "START");
  EXPECT_EQ(emitted[0], "");
  EXPECT_EQ(emitted[1], "START");
  EXPECT_FALSE(t.stopped());
}

TEST(TextOutput, IncompleteUtf8IsHeldUntilComplete) {
  TextOutput t;
  std::vector<std::string> emitted;
  // U+00E9 (C3 A9) and U+1F600 (F0 9F 98 80) split across pieces.
  EXPECT_EQ(run(t, {"caf\xC3", "\xA9 ", "\xF0\x9F", "\x98", "\x80"}, &emitted), "caf\xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(emitted[0], "caf");
  EXPECT_EQ(emitted[1], "\xC3\xA9 ");
  EXPECT_EQ(emitted[2], "");
  EXPECT_EQ(emitted[3], "");
}

TEST(TextOutput, TruncatedUtf8AtTheEndBecomesReplacementCharacter) {
  TextOutput t;
  EXPECT_EQ(run(t, {"ab\xE2\x82"}), "ab\xEF\xBF\xBD");
}

TEST(TextOutput, EarliestOfSeveralStopStringsWins) {
  TextOutput t({"world", "lo"});
  EXPECT_EQ(run(t, {"hello world"}), "hel");
}

TEST(TextOutput, IllFormedBytesBecomeOneReplacementPerMaximalSubpart) {
  TextOutput t;
  // A lone continuation byte, a lead byte cut short by ASCII, a surrogate (ED A0 80: three subparts, as
  // ED's second byte must be 80..9F), an overlong form (C0 AF: two), a byte that never starts a character.
  EXPECT_EQ(run(t, {"a\x80" "b", "\xC3x", "\xED\xA0\x80", "\xC0\xAF", "\xFF!"}),
            "a\xEF\xBF\xBD" "b\xEF\xBF\xBD" "x\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD!");
}

TEST(TextOutput, AStopStringIsCutEvenWhenAReplacementCompletesIt) {
  // The tail "\xD3" is incomplete at the end and becomes U+FFFD, whose last byte is the stop string.
  TextOutput t({"\xEF\xBF\xBD"});
  EXPECT_EQ(run(t, {"ok\x06", "E\xD3"}), "ok\x06" "E");
  EXPECT_TRUE(t.stopped());
  // And in the middle: "\x80" becomes U+FFFD, then the stop string "\xEF\xBF\xBD tail" matches it.
  TextOutput mid({"\xEF\xBF\xBD tail"});
  EXPECT_EQ(run(mid, {"head", "\x80", " tail end"}), "head");
}

TEST(TextOutput, IsValidUtf8FollowsTheUnicodeTable) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain"));
  EXPECT_TRUE(is_valid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(is_valid_utf8("\xBD"));              // a lone continuation byte
  EXPECT_FALSE(is_valid_utf8("\xC3"));              // cut short
  EXPECT_FALSE(is_valid_utf8("\xC1\xBF"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xE0\x9F\xBF"));      // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xF5\x80\x80\x80"));
}

}  // namespace
}  // namespace inferd::daemon
