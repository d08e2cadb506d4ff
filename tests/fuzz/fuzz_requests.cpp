// libFuzzer target: what a client's request text goes through before it reaches a model — OpenAI's JSON
// bodies (chat, completions, embeddings), chat messages through every template family, Jinja chat
// templates (parsed and rendered under the engine's step and depth limits), and generated
// text through the stop-string filter. Checked beyond memory safety: released text is valid UTF-8, never
// contains a stop string, and nothing is released after one.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat_template.h"
#include "openai.h"
#include "text_output.h"

namespace {

// Splits at '\x1f' (unit separator).
std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t end = s.find('\x1f', start);
    out.emplace_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace inferd;
  using namespace inferd::daemon;
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 4) {
    case 0:  // an HTTP request body, to each endpoint
      (void)openai::parse_request(openai::Endpoint::kChat, text, 1 << 16);
      (void)openai::parse_request(openai::Endpoint::kCompletions, text, 1 << 16);
      (void)openai::parse_embedding_request(text, 1 << 16);
      break;
    case 1: {  // chat messages: role, content, role, content, ...; and the text as a template's source
      const std::vector<std::string> parts = split(text);
      std::vector<ChatMessage> messages;
      for (size_t i = 0; i + 1 < parts.size(); i += 2) messages.push_back(ChatMessage{parts[i], parts[i + 1]});
      for (ChatTemplate t : {ChatTemplate::kChatml, ChatTemplate::kLlama3, ChatTemplate::kLlama2, ChatTemplate::kZephyr,
                             ChatTemplate::kPhi3, ChatTemplate::kGemma}) {
        (void)apply_chat_template(t, messages);
      }
      (void)chat_template_name(detect_chat_template(text));
      break;
    }
    case 2:
      if (data[0] == 2) {  // the text as a Jinja chat template, rendered for two messages
        const ChatFormatter f = ChatFormatter::jinja(text, "<s>", "</s>");
        (void)f.apply({ChatMessage{"system", "Be brief."}, ChatMessage{"user", "Hi {{ x }} {% if %}"}});
        break;
      }
      [[fallthrough]];
    default: {  // stop strings, then the pieces a model generates
      const std::vector<std::string> parts = split(text);
      const size_t n_stop = std::min<size_t>(data[0] / 4 % 4, parts.size());
      std::vector<std::string> stop;
      for (size_t i = 0; i < n_stop; ++i) {
        // The scheduler refuses a request with a stop string that is not valid UTF-8.
        if (!parts[i].empty() && is_valid_utf8(parts[i])) stop.push_back(parts[i]);
      }
      TextOutput out(stop);
      std::string released;
      bool stopped = false;
      for (size_t i = n_stop; i < parts.size(); ++i) {
        const std::string piece = out.push(parts[i]);
        INFERD_ASSERT(!stopped || piece.empty(), "text released after a stop string");
        released += piece;
        stopped = out.stopped();
      }
      if (!out.stopped()) released += out.finish();
      INFERD_ASSERT(is_valid_utf8(released), "released text is not valid UTF-8");
      for (const std::string& s : stop) {
        INFERD_ASSERT(released.find(s) == std::string::npos, "a stop string was released");
      }
      break;
    }
  }
  return 0;
}
