// daemon/chat_template.h — turning chat messages into a prompt with the model's template.
//
// GGUF files carry their chat template as Jinja source (tokenizer.chat_template). Like llama.cpp, inferd
// does not run Jinja: it recognises the template family by its markers and formats the messages with
// built-in code for that family. A template that matches no family falls back to ChatML, and the
// model's status names the family used so a user can see it.
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "inferd/status.h"

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

}  // namespace inferd::daemon
