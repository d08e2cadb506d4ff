#include "chat_template.h"

#include <ctime>

namespace inferd::daemon {

namespace {
// The messages the API accepts, whatever formats them: at least one, each system, user or assistant.
Status check_messages(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return Status(Code::kInvalidArgument, "a chat needs at least one message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      return Status(Code::kInvalidArgument, "message " + std::to_string(i) + ": role '" + r +
                                                "' is not one of system, user, assistant");
    }
  }
  return Status::ok();
}
}  // namespace

ChatTemplate detect_chat_template(std::string_view src, std::string_view arch) {
  auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
  if (src.empty() && arch.substr(0, 5) == "gemma") return ChatTemplate::kGemma;
  if (src.empty() && arch == "phi3") return ChatTemplate::kPhi3;
  if (has("<|im_start|>")) return ChatTemplate::kChatml;
  if (has("<|start_header_id|>")) return ChatTemplate::kLlama3;
  if (has("<start_of_turn>")) return ChatTemplate::kGemma;
  if (has("<|user|>") && has("<|end|>")) return ChatTemplate::kPhi3;
  if (has("<|user|>")) return ChatTemplate::kZephyr;
  if (has("[INST]")) return ChatTemplate::kLlama2;
  return ChatTemplate::kChatml;
}

Result<ChatTemplate> chat_template_by_name(std::string_view name) {
  for (ChatTemplate t : {ChatTemplate::kChatml, ChatTemplate::kLlama3, ChatTemplate::kLlama2, ChatTemplate::kZephyr,
                         ChatTemplate::kPhi3, ChatTemplate::kGemma}) {
    if (name == chat_template_name(t)) return t;
  }
  return Status(Code::kInvalidArgument, "unknown chat template '" + std::string(name) +
                                            "' (built-in: chatml, llama3, llama2, zephyr, phi3, gemma; empty: the file's)");
}

ChatFormatter ChatFormatter::builtin(ChatTemplate t) {
  ChatFormatter f;
  f.family_ = t;
  return f;
}

ChatFormatter ChatFormatter::jinja(std::string_view source, std::string bos_token, std::string eos_token) {
  ChatFormatter f;
  f.is_jinja_ = true;
  f.bos_ = std::move(bos_token);
  f.eos_ = std::move(eos_token);
  auto t = jinja::Template::parse(source);
  if (t) {
    f.template_ = std::make_shared<const jinja::Template>(std::move(t).value());
  } else {
    f.error_ = Status(t.status().code(), "the model's chat template cannot be used: " + t.status().message() +
                                             " (load with a built-in format: chatTemplate / inferctl load --chat-template)");
  }
  return f;
}

std::string ChatFormatter::name() const {
  if (!is_jinja_) return chat_template_name(family_);
  return error_ ? "jinja" : "jinja (unusable)";
}

Result<std::string> ChatFormatter::apply(const std::vector<ChatMessage>& messages) const {
  if (!is_jinja_) return apply_chat_template(family_, messages);
  if (!error_) return error_;
  INFERD_RETURN_IF_ERROR(check_messages(messages));
  jinja::Array list;
  for (const ChatMessage& m : messages) {
    jinja::Object o;
    o.set("role", jinja::Value(m.role));
    o.set("content", jinja::Value(m.content));
    list.push_back(jinja::Value(std::move(o)));
  }
  jinja::Object ctx;
  ctx.set("messages", jinja::Value(std::move(list)));
  ctx.set("bos_token", jinja::Value(bos_));
  ctx.set("eos_token", jinja::Value(eos_));
  ctx.set("add_generation_prompt", jinja::Value(true));
  return template_->render(jinja::Value(std::move(ctx)), static_cast<int64_t>(std::time(nullptr)));
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kChatml: return "chatml";
    case ChatTemplate::kLlama3: return "llama3";
    case ChatTemplate::kLlama2: return "llama2";
    case ChatTemplate::kZephyr: return "zephyr";
    case ChatTemplate::kPhi3: return "phi3";
    case ChatTemplate::kGemma: return "gemma";
  }
  return "?";
}

Result<std::string> apply_chat_template(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  INFERD_RETURN_IF_ERROR(check_messages(messages));
  std::string out;
  switch (t) {
    case ChatTemplate::kChatml:
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      break;
    case ChatTemplate::kLlama3:
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      }
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatTemplate::kZephyr:
      for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "</s>\n";
      out += "<|assistant|>\n";
      break;
    case ChatTemplate::kPhi3:
      for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
      out += "<|assistant|>\n";
      break;
    case ChatTemplate::kGemma: {
      std::string system;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system += m.content + "\n\n";
          continue;
        }
        out += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : "user") + "\n" +
               (m.role == "user" ? std::exchange(system, "") : "") + m.content + "<end_of_turn>\n";
      }
      out += "<start_of_turn>model\n";
      break;
    }
    case ChatTemplate::kLlama2: {
      // [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] assistant</s><s>[INST] user [/INST]
      std::string system;
      bool open = false;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system = "<<SYS>>\n" + m.content + "\n<</SYS>>\n\n";
        } else if (m.role == "user") {
          out += "[INST] " + std::exchange(system, "") + m.content + " [/INST]";
          open = true;
        } else {
          out += " " + m.content + "</s>";
          open = false;
        }
      }
      (void)open;
      break;
    }
  }
  return out;
}

void drop_leading_bos(std::string& text, std::string_view bos) {
  if (!bos.empty() && std::string_view(text).substr(0, bos.size()) == bos) text.erase(0, bos.size());
}

}  // namespace inferd::daemon
