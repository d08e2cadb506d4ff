// daemon/chat_template.h — turning chat messages into a prompt with the model's template.
//
// GGUF files carry their chat template as Jinja source (tokenizer.chat_template). A ChatFormatter renders
// it with inferd's Jinja engine (jinja.h) as Hugging Face's transformers does; a template the engine cannot
// parse makes every chat request fail with the error that names the construct (the model still serves
// plain prompts), never a silent change of format. Built-in formats for six families remain, chosen
// explicitly (LoadOptions.chatTemplate) or for files that store no template (by architecture: gemma*
// get Gemma's turns, others ChatML).
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "inferd/status.h"
#include "jinja.h"

namespace inferd::daemon {

enum class ChatTemplate { kChatml, kLlama3, kLlama2, kZephyr, kPhi3, kGemma };

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// `arch`: the model's general.architecture, for files that store no template: Gemma models get their
// own turn format, others ChatML (as llama.cpp's default).
ChatTemplate detect_chat_template(std::string_view jinja_source, std::string_view arch = {});
const char* chat_template_name(ChatTemplate t);

// The prompt for `messages`, ending with the opening of the assistant's turn. kInvalidArgument for an
// empty list or a role other than system/user/assistant.
Result<std::string> apply_chat_template(ChatTemplate t, const std::vector<ChatMessage>& messages);
// The built-in format named `name` ("chatml", "llama3", ...); kInvalidArgument naming the choices.
Result<ChatTemplate> chat_template_by_name(std::string_view name);

class ChatFormatter {
 public:
  // A built-in format.
  static ChatFormatter builtin(ChatTemplate t);
  // The file's Jinja template, with the tokenizer's BOS/EOS texts. A source the engine cannot parse gives a
  // formatter whose apply() returns that error (status() has it too).
  static ChatFormatter jinja(std::string_view source, std::string bos_token, std::string eos_token);

  // The prompt for `messages`, with the assistant's turn opened (add_generation_prompt).
  Result<std::string> apply(const std::vector<ChatMessage>& messages) const;
  // "jinja" (the file's template), "jinja (unusable)" or the built-in format's name.
  std::string name() const;
  const Status& status() const { return error_; }

 private:
  bool is_jinja_ = false;
  ChatTemplate family_ = ChatTemplate::kChatml;
  std::shared_ptr<const jinja::Template> template_;
  std::string bos_, eos_;
  Status error_;
};

// For a tokenizer that adds BOS itself: removes a leading `bos` that a template wrote ({{ bos_token }}), so the
// prompt has one BOS, as transformers (which tokenizes a template's output without special tokens) gives.
void drop_leading_bos(std::string& text, std::string_view bos);

}  // namespace inferd::daemon
