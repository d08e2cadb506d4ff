// daemon/openai.h — OpenAI's HTTP API in terms of the daemon's requests: request bodies (JSON) to
// GenerateParams, results to response bodies and server-sent-event chunks, Status to OpenAI's error
// JSON and HTTP status. Pure functions: the HTTP server (http_server.cpp) does the I/O.
//
// What is accepted (POST /v1/chat/completions and /v1/completions): model, messages (string content or
// an array of text parts) / prompt (a string, or an array of one string), stream,
// stream_options.include_usage, max_tokens / max_completion_tokens, temperature, top_p, top_k, min_p,
// seed, stop (a string or up to 16 strings), frequency_penalty, presence_penalty, repeat_penalty,
// n (1 only), user (ignored), logprobs + top_logprobs (chat) / logprobs N (completions), llama-server's
// ignore_eos, and ollama's keep_alive. Fields that would change the answer and are not supported (tools,
// function calling, a response_format other than text, echo, suffix, best_of > 1, n > 1) are a 400
// naming the field, never silently dropped; other unknown fields are ignored, as OpenAI's API does.
// Log-probabilities are the model's (log-softmax of its logits, before penalties and temperature), as
// vLLM reports them; at most 20 alternatives per token.
//
// POST /v1/embeddings: model, input (a string, an array of strings, an array of token ids or an array of
// such arrays; at most 2048 inputs), encoding_format (float or base64, the openai SDK's default),
// dimensions (only the model's own), user (ignored). Each input's embedding is the last token's hidden
// state after the output norm, L2-normalized (last-token pooling, as decoder embedding models such as
// Qwen3-Embedding and e5-mistral pool).
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
  // ollama's keep_alive, in seconds (0: never unload; absent: -1, the model's own): how long a model
  // loaded by name stays loaded after its last request.
  double keep_alive_s = -1;
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

// Log-probabilities of a response's tokens, in the endpoint's shape: chat's {"content": [{token, logprob,
// bytes, top_logprobs}]}, or the completions' {tokens, token_logprobs, top_logprobs, text_offset}, whose
// text offsets count bytes from `*offset` (advanced past these tokens).
struct Logprobs {
  bool wanted = false;
  const std::vector<TokenLogprobs>* tokens = nullptr;
  size_t* offset = nullptr;  // completions: bytes of the text before these tokens
};

// The whole (non-streamed) response.
std::string response_body(Endpoint endpoint, const ResponseId& rid, const std::string& text, const GenerateSummary& s,
                          Logprobs logprobs = {});

// One server-sent event ("data: {...}\n\n") carrying generated text (and the assistant role first, for
// chat), the last event with the finish reason, the usage event, and the closing "data: [DONE]\n\n".
std::string chunk_event(Endpoint endpoint, const ResponseId& rid, const std::string& text, bool first,
                        Logprobs logprobs = {});
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

// POST /v1/embeddings.
struct EmbeddingRequest {
  std::string model;
  std::vector<GenerateParams> inputs;  // one generation request each (GenerateParams::embedding)
  bool base64 = false;                 // encoding_format
  double keep_alive_s = -1;
};
inline constexpr size_t kMaxEmbeddingInputs = 2048;
Result<EmbeddingRequest> parse_embedding_request(std::string_view body, uint32_t max_text_bytes);
// The response: one embedding per input, in order (`results[i].embedding`), and the prompt tokens used.
std::string embeddings_body(const std::string& model, const std::vector<GenerateSummary>& results, bool base64);
// Base64 of bytes (RFC 4648, padded): how encoding_format=base64 sends the little-endian float32s.
std::string base64(std::string_view bytes);

// GET /v1/models: the loaded models' ids.
std::string models_body(const std::vector<std::string>& ids);

}  // namespace inferd::daemon::openai
