#include "chat_template.h"

#include <gtest/gtest.h>

namespace inferd::daemon {
namespace {

TEST(ChatTemplate, DetectsFamiliesByTheirMarkers) {
  EXPECT_EQ(detect_chat_template("{% for m in messages %}<|im_start|>{{m.role}}"), ChatTemplate::kChatml);
  EXPECT_EQ(detect_chat_template("<|start_header_id|>{{ message['role'] }}<|end_header_id|>"), ChatTemplate::kLlama3);
  EXPECT_EQ(detect_chat_template("[INST] {{ content }} [/INST]"), ChatTemplate::kLlama2);
  EXPECT_EQ(detect_chat_template("<|user|>\n{{ content }}</s>"), ChatTemplate::kZephyr);
  EXPECT_EQ(detect_chat_template("<|user|>\n{{ content }}<|end|>"), ChatTemplate::kPhi3);
  EXPECT_EQ(detect_chat_template("<start_of_turn>user"), ChatTemplate::kGemma);
  EXPECT_EQ(detect_chat_template(""), ChatTemplate::kChatml);
}

TEST(ChatTemplate, TheFilesTemplateRendersAndRefusesWhatTheApiRefuses) {
  const ChatFormatter f = ChatFormatter::jinja(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
      "<s>", "</s>");
  EXPECT_EQ(f.name(), "jinja");
  auto r = f.apply({{"system", "S"}, {"user", "Hi"}});
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(r.value(), "<s><system>S<user>Hi<assistant>");
  EXPECT_EQ(f.apply({{"wizard", "x"}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(f.apply({}).status().code(), Code::kInvalidArgument);
  const ChatFormatter broken = ChatFormatter::jinja("{% frobnicate %}", "<s>", "</s>");
  EXPECT_EQ(broken.name(), "jinja (unusable)");
  EXPECT_NE(broken.apply({{"user", "Hi"}}).status().message().find("frobnicate"), std::string::npos);
}

TEST(ChatTemplate, FilesWithoutATemplateGetTheirArchitecturesFormat) {
  EXPECT_EQ(detect_chat_template("", "gemma3"), ChatTemplate::kGemma);  // gemma-3-270m stores none
  EXPECT_EQ(detect_chat_template("", "llama"), ChatTemplate::kChatml);
  EXPECT_EQ(detect_chat_template("<|im_start|>", "gemma3"), ChatTemplate::kChatml);  // a stored template wins
}

TEST(ChatTemplate, ChatmlMatchesTheReferenceFormatting) {
  auto r = apply_chat_template(ChatTemplate::kChatml, {{"system", "Be brief."}, {"user", "Hi"}});
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(r.value(), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3) {
  auto r = apply_chat_template(ChatTemplate::kLlama3, {{"user", "Hi"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value(), "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Llama2FoldsTheSystemPromptIntoTheFirstTurn) {
  auto r = apply_chat_template(ChatTemplate::kLlama2, {{"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value(), "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1</s>[INST] U2 [/INST]");
}

TEST(ChatTemplate, RejectsBadInput) {
  EXPECT_EQ(apply_chat_template(ChatTemplate::kChatml, {}).status().code(), Code::kInvalidArgument);
  auto r = apply_chat_template(ChatTemplate::kChatml, {{"wizard", "x"}});
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("wizard"), std::string::npos);
}

}  // namespace
}  // namespace inferd::daemon

namespace inferd::daemon {
namespace {

TEST(ChatTemplate, DropsOneLeadingBos) {
  std::string t = "<s><s>[INST] hi";
  drop_leading_bos(t, "<s>");
  EXPECT_EQ(t, "<s>[INST] hi");  // one: the tokenizer adds the other
  std::string u = "[INST] <s>";
  drop_leading_bos(u, "<s>");
  EXPECT_EQ(u, "[INST] <s>");  // only at the start
  drop_leading_bos(u, "");
  EXPECT_EQ(u, "[INST] <s>");
  EXPECT_EQ(detect_chat_template("", "phi3"), ChatTemplate::kPhi3);  // phi3 files without a template
}

}  // namespace
}  // namespace inferd::daemon
