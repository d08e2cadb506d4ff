// daemon/openai.h — OpenAI's HTTP API in terms of the daemon's requests: request bodies (JSON) to
// GenerateParams, results to response bodies and server-sent-event chunks, Status to OpenAI's error
// JSON and HTTP status. Pure functions: the HTTP server (http_server.cpp) does the I/O.
//
// What is accepted (POST /v1/chat/completions and /v1/completions): model, messages (string content or
// an array of text parts) / prompt (a string, or an array of one string), stream,
// stream_options.include_usage, max_tokens / max_completion_tokens, temperature, top_p, top_k, min_p,
// seed, stop (a string or up to 16 strings), frequency_penalty, presence_penalty, repeat_penalty,
// n (1 only), user (ignored), and llama-server's ignore_eos. Fields that would change the answer and are not supported (logprobs,
// tools, function calling, a response_format other than text, echo, suffix, best_of > 1, n > 1) are a
// 400 naming the field, never silently dropped; other unknown fields are ignored, as OpenAI's API does.
// Absent sampling fields take the daemon's defaults (llama.cpp's: temperature 0.8, top_k 40, top_p
// 0.95, min_p 0.05), as llama-server does; the sampler validates the values (a 400 naming the field).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "generation.h"
#include "inferd/status.h"

namespace inferd::daemon::openai {

enum class Endpoint { kChat, kCompletions };

struct Request {
  Endpoint endpoint = Endpoint::kChat;
  GenerateParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses a request body. kInvalidArgument naming the field for anything malformed; `max_text_bytes`
// bounds the prompt or the messages' total.
Result<Request> parse_request(Endpoint endpoint, std::string_view body, uint32_t max_text_bytes);

// "stop" or "length", as OpenAI reports finish reasons.
const char* finish_reason(FinishReason r);

// Identity of one response: "chatcmpl-…" or "cmpl-…", its creation time (Unix seconds) and model.
struct ResponseId {
  std::string id;
  int64_t created = 0;
  std::string model;
};
ResponseId new_response_id(Endpoint endpoint, const std::string& model);

// The whole (non-streamed) response.
std::string response_body(Endpoint endpoint, const ResponseId& rid, const std::string& text, const GenerateSummary& s);

// One server-sent event ("data: {...}\n\n") carrying generated text (and the assistant role first, for
// chat), the last event with the finish reason, the usage event, and the closing "data: [DONE]\n\n".
std::string chunk_event(Endpoint endpoint, const ResponseId& rid, const std::string& text, bool first);
std::string finish_event(Endpoint endpoint, const ResponseId& rid, FinishReason reason);
std::string usage_event(Endpoint endpoint, const ResponseId& rid, const GenerateSummary& s);
std::string done_event();
// An error in the middle of a stream (the HTTP status is already sent): an event with OpenAI's error object.
std::string error_event(const Status& s);

// OpenAI's error body and the HTTP status for a Status: 400 invalid argument, 404 unknown model,
// 413 too large, 429 overloaded, 501 unimplemented, 503 not ready, 500 otherwise.
struct Error {
  unsigned http_status = 500;
  std::string body;
};
Error error_for(const Status& s);
Error error(unsigned http_status, std::string_view type, std::string_view message, std::string_view code = "");

// GET /v1/models: the loaded models' ids.
std::string models_body(const std::vector<std::string>& ids);

}  // namespace inferd::daemon::openai
