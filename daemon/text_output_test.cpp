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

}  // namespace
}  // namespace inferd::daemon
