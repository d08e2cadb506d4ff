#include "openai.h"
// GCC 12 reports std::string concatenations of literals as overlapping memcpy (-Wrestrict, GCC bug
// 105329), a false positive.
#pragma GCC diagnostic ignored "-Wrestrict"

#include <nlohmann/json.hpp>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

namespace inferd::daemon::openai {
namespace {

using json = nlohmann::json;

Status bad(std::string message) { return Status(Code::kInvalidArgument, std::move(message)); }

// Text for JSON: invalid UTF-8 becomes U+FFFD instead of an exception. Generated text is valid UTF-8
// already (TextOutput decodes it); this is a second line of defence.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

Status wrong_type(std::string_view field, std::string_view expected, const json& v) {
  return bad("'" + std::string(field) + "' must be " + std::string(expected) + ", got " + type_name(v));
}

// A present, non-null field, or nullptr.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

Status get_number(const json& body, const char* name, float* out) {
  const json* v = field(body, name);
  if (v == nullptr) return Status::ok();
  if (!v->is_number()) return wrong_type(name, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d) || std::fabs(d) > 1e30) return bad(std::string("'") + name + "' is out of range");
  *out = static_cast<float>(d);
  return Status::ok();
}

Status get_int(const json& body, const char* name, int64_t min, int64_t max, int64_t* out, bool* present = nullptr) {
  const json* v = field(body, name);
  if (present != nullptr) *present = v != nullptr;
  if (v == nullptr) return Status::ok();
  if (!v->is_number_integer() && !(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>())) {
    return wrong_type(name, "an integer", *v);
  }
  const double d = v->get<double>();
  if (d < static_cast<double>(min) || d > static_cast<double>(max)) {
    return bad(std::string("'") + name + "' must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " +
               v->dump());
  }
  *out = v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(d);
  return Status::ok();
}

Status get_bool(const json& body, const char* name, bool* out) {
  const json* v = field(body, name);
  if (v == nullptr) return Status::ok();
  if (!v->is_boolean()) return wrong_type(name, "a boolean", *v);
  *out = v->get<bool>();
  return Status::ok();
}

// A message's content: a string, or an array of parts of which the text ones are joined.
Result<std::string> content_text(const json& content, size_t index) {
  const std::string where = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return wrong_type(where, "a string or an array of parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string pw = where + "[" + std::to_string(i) + "]";
    if (!part.is_object()) return wrong_type(pw, "an object", part);
    const json* type = field(part, "type");
    if (type == nullptr || !type->is_string()) return bad("'" + pw + ".type' must be a string");
    if (type->get<std::string>() != "text") {
      return Status(Code::kUnimplemented, "'" + pw + ".type' is '" + type->get<std::string>() +
                                              "': only text parts are supported");
    }
    const json* t = field(part, "text");
    if (t == nullptr || !t->is_string()) return bad("'" + pw + ".text' must be a string");
    text += t->get<std::string>();
  }
  return text;
}

// Chat: "logprobs": true with "top_logprobs": N (0..20); completions: "logprobs": N (0..20). `out`: N,
// or -1 when none are wanted.
Status get_logprobs(const json& body, Endpoint endpoint, int32_t* out) {
  constexpr int64_t kMax = 20;
  *out = -1;
  if (endpoint == Endpoint::kChat) {
    bool want = false;
    INFERD_RETURN_IF_ERROR(get_bool(body, "logprobs", &want));
    int64_t top = 0;
    bool has_top = false;
    INFERD_RETURN_IF_ERROR(get_int(body, "top_logprobs", 0, kMax, &top, &has_top));
    if (has_top && !want) return bad("'top_logprobs' needs 'logprobs': true");
    if (want) *out = static_cast<int32_t>(top);
    return Status::ok();
  }
  const json* v = field(body, "logprobs");
  if (v != nullptr && v->is_boolean()) {  // some clients send the chat form to /v1/completions
    if (v->get<bool>()) *out = 0;
    return Status::ok();
  }
  int64_t n = -1;
  bool has = false;
  INFERD_RETURN_IF_ERROR(get_int(body, "logprobs", 0, kMax, &n, &has));
  if (has) *out = static_cast<int32_t>(n);
  return Status::ok();
}

// ollama's keep_alive: seconds as a number, or a duration string ("90s", "5m", "1h", "0"); a negative
// value (ollama: forever) is 0, never unload.
Status get_keep_alive(const json& body, double* out) {
  const json* v = field(body, "keep_alive");
  if (v == nullptr) return Status::ok();
  double seconds = 0;
  if (v->is_number()) {
    seconds = v->get<double>();
  } else if (v->is_string()) {
    const std::string t = v->get<std::string>();
    size_t used = 0;
    double n = 0;
    try {
      n = std::stod(t, &used);
    } catch (const std::exception&) {
      return bad("'keep_alive' must be seconds or a duration such as \"5m\", got \"" + t.substr(0, 32) + "\"");
    }
    const std::string unit = t.substr(used);
    const double scale = unit.empty() || unit == "s" ? 1 : unit == "ms" ? 1e-3 : unit == "m" ? 60 : unit == "h" ? 3600 : -1;
    if (scale < 0) return bad("'keep_alive' has an unknown unit \"" + unit.substr(0, 8) + "\" (use ms, s, m or h)");
    seconds = n * scale;
  } else {
    return wrong_type("keep_alive", "a number of seconds or a duration string", *v);
  }
  if (!std::isfinite(seconds) || seconds > 365.0 * 86400) return bad("'keep_alive' must be at most a year");
  *out = seconds < 0 ? 0 : seconds;
  return Status::ok();
}

// A request body: a JSON object.
Status parse_body(std::string_view text, json* out) {
  *out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return bad("the request body is not valid JSON");
  if (!out->is_object()) return bad("the request body must be a JSON object");
  return Status::ok();
}

// The required "model": a non-empty string.
Status get_model(const json& body, std::string* out) {
  const json* model = field(body, "model");
  if (model == nullptr) return bad("you must provide a 'model' parameter");
  if (!model->is_string() || model->get<std::string>().empty()) return wrong_type("model", "a non-empty string", *model);
  *out = model->get<std::string>();
  return Status::ok();
}

Status refuse_unsupported(const json& body, Endpoint endpoint) {
  for (const char* name : {"tools", "functions", "tool_choice", "function_call"}) {
    if (const json* v = field(body, name); v != nullptr && !(v->is_array() && v->empty()) && !(v->is_string() && v->get<std::string>() == "none")) {
      return Status(Code::kUnimplemented, std::string("'") + name + "': tool and function calling are not supported");
    }
  }
  if (const json* rf = field(body, "response_format"); rf != nullptr) {
    const json* t = rf->is_object() ? field(*rf, "type") : nullptr;
    if (t == nullptr || !t->is_string() || t->get<std::string>() != "text") {
      return Status(Code::kUnimplemented, "'response_format': only {\"type\": \"text\"} is supported");
    }
  }
  if (endpoint == Endpoint::kCompletions) {
    if (const json* v = field(body, "echo"); v != nullptr && !(v->is_boolean() && !v->get<bool>())) {
      return Status(Code::kUnimplemented, "'echo' is not supported");
    }
    if (const json* v = field(body, "suffix"); v != nullptr && !(v->is_string() && v->get<std::string>().empty())) {
      return Status(Code::kUnimplemented, "'suffix' is not supported");
    }
    int64_t best_of = 1;
    INFERD_RETURN_IF_ERROR(get_int(body, "best_of", 1, 1, &best_of));
  }
  int64_t n = 1;
  INFERD_RETURN_IF_ERROR(get_int(body, "n", 1, 1, &n));
  return Status::ok();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string object_name(Endpoint e, bool chunk) {
  if (e == Endpoint::kCompletions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

json usage(const GenerateSummary& s) {
  return json{{"prompt_tokens", s.prompt_tokens},
              {"completion_tokens", s.generated_tokens},
              {"total_tokens", s.prompt_tokens + s.generated_tokens},
              {"prompt_tokens_details", json{{"cached_tokens", s.cached_tokens}}}};
}

json base(Endpoint e, const ResponseId& rid, bool chunk) {
  return json{{"id", rid.id},
              {"object", object_name(e, chunk)},
              {"created", rid.created},
              {"model", rid.model},
              {"system_fingerprint", std::string("inferd-") + INFERD_VERSION}};
}

std::string event(const json& j) { return "data: " + dump(j) + "\n\n"; }

json bytes_of(const std::string& piece) {
  json b = json::array();
  for (unsigned char c : piece) b.push_back(static_cast<int>(c));
  return b;
}

json logprobs_json(Endpoint e, const Logprobs& lp) {
  if (!lp.wanted) return nullptr;
  static const std::vector<TokenLogprobs> kNone;
  const std::vector<TokenLogprobs>& tokens = lp.tokens != nullptr ? *lp.tokens : kNone;
  if (e == Endpoint::kChat) {
    json content = json::array();
    for (const TokenLogprobs& t : tokens) {
      json top = json::array();
      for (const TokenLogprob& a : t.top) {
        top.push_back(json{{"token", a.piece}, {"logprob", a.logprob}, {"bytes", bytes_of(a.piece)}});
      }
      content.push_back(json{{"token", t.chosen.piece},
                             {"logprob", t.chosen.logprob},
                             {"bytes", bytes_of(t.chosen.piece)},
                             {"top_logprobs", top}});
    }
    return json{{"content", content}, {"refusal", nullptr}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprobs& t : tokens) {
    toks.push_back(t.chosen.piece);
    lps.push_back(t.chosen.logprob);
    json top = json::object();
    for (const TokenLogprob& a : t.top) {
      if (!top.contains(a.piece)) top[a.piece] = a.logprob;  // two ids may decode alike: the likelier is kept
    }
    tops.push_back(top);
    offsets.push_back(lp.offset != nullptr ? *lp.offset : 0);
    if (lp.offset != nullptr) *lp.offset += t.chosen.piece.size();
  }
  return json{{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace

Result<Request> parse_request(Endpoint endpoint, std::string_view text, uint32_t max_text_bytes) {
  json body;
  INFERD_RETURN_IF_ERROR(parse_body(text, &body));
  Request r;
  r.endpoint = endpoint;
  GenerateParams& p = r.params;
  INFERD_RETURN_IF_ERROR(get_model(body, &p.model));
  INFERD_RETURN_IF_ERROR(refuse_unsupported(body, endpoint));

  size_t text_bytes = 0;
  if (endpoint == Endpoint::kChat) {
    const json* messages = field(body, "messages");
    if (messages == nullptr) return bad("you must provide a 'messages' parameter");
    if (!messages->is_array()) return wrong_type("messages", "an array", *messages);
    if (messages->empty()) return bad("'messages' must hold at least one message");
    p.input = GenerateParams::Input::kMessages;
    for (size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return wrong_type(where, "an object", m);
      const json* role = field(m, "role");
      if (role == nullptr || !role->is_string()) return bad("'" + where + ".role' must be a string");
      std::string role_s = role->get<std::string>();
      if (role_s == "developer") role_s = "system";  // OpenAI's newer name for the system role
      if (role_s != "system" && role_s != "user" && role_s != "assistant") {
        return Status(Code::kUnimplemented, "'" + where + ".role' is '" + role_s +
                                                "': only system, developer, user and assistant messages are supported");
      }
      const json* content = field(m, "content");
      auto c = content_text(content != nullptr ? *content : json(), i);
      if (!c) return c.status();
      text_bytes += c->size();
      p.messages.push_back(ChatMessage{std::move(role_s), std::move(c).value()});
    }
  } else {
    const json* prompt = field(body, "prompt");
    if (prompt == nullptr) return bad("you must provide a 'prompt' parameter");
    p.input = GenerateParams::Input::kPrompt;
    if (prompt->is_string()) {
      p.prompt = prompt->get<std::string>();
    } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
      p.prompt = (*prompt)[0].get<std::string>();
    } else if (prompt->is_array() && prompt->size() > 1) {
      return Status(Code::kUnimplemented, "'prompt' holds several prompts: send one per request");
    } else {
      return wrong_type("prompt", "a string", *prompt);
    }
    text_bytes = p.prompt.size();
  }
  if (text_bytes > max_text_bytes) {
    return Status(Code::kOutOfRange, "the prompt is " + std::to_string(text_bytes) + " bytes; this daemon takes at most " +
                                         std::to_string(max_text_bytes));
  }

  INFERD_RETURN_IF_ERROR(get_bool(body, "stream", &r.stream));
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
    INFERD_RETURN_IF_ERROR(get_bool(*so, "include_usage", &r.include_usage));
  }
  int64_t max_tokens = 0;
  bool has_max = false;
  constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
  INFERD_RETURN_IF_ERROR(get_int(body, "max_completion_tokens", 0, kMaxTokens, &max_tokens, &has_max));
  if (!has_max) INFERD_RETURN_IF_ERROR(get_int(body, "max_tokens", 0, kMaxTokens, &max_tokens));
  p.max_tokens = static_cast<uint32_t>(max_tokens);  // 0 or absent: until the end of generation or the context

  SamplingParams& s = p.sampling;
  INFERD_RETURN_IF_ERROR(get_number(body, "temperature", &s.temperature));
  INFERD_RETURN_IF_ERROR(get_number(body, "top_p", &s.top_p));
  INFERD_RETURN_IF_ERROR(get_number(body, "min_p", &s.min_p));
  INFERD_RETURN_IF_ERROR(get_number(body, "frequency_penalty", &s.frequency_penalty));
  INFERD_RETURN_IF_ERROR(get_number(body, "presence_penalty", &s.presence_penalty));
  INFERD_RETURN_IF_ERROR(get_number(body, "repeat_penalty", &s.repeat_penalty));
  int64_t top_k = s.top_k;
  INFERD_RETURN_IF_ERROR(get_int(body, "top_k", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), &top_k));
  s.top_k = static_cast<int32_t>(top_k);
  int64_t seed = 0;
  bool has_seed = false;
  INFERD_RETURN_IF_ERROR(get_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                                 &seed, &has_seed));
  if (has_seed) s.seed = seed == -1 ? SamplingParams::kSeedFromClock : static_cast<uint64_t>(seed);  // -1: random
  if (Status ok = validate(s); !ok) return bad(ok.message());

  if (const json* stop = field(body, "stop")) {
    constexpr size_t kMaxStops = 16;
    if (stop->is_string()) {
      if (!stop->get<std::string>().empty()) p.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStops) return bad("'stop' holds " + std::to_string(stop->size()) + " strings; at most 16");
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) return wrong_type("stop[" + std::to_string(i) + "]", "a string", (*stop)[i]);
        if (!(*stop)[i].get<std::string>().empty()) p.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      return wrong_type("stop", "a string or an array of strings", *stop);
    }
  }
  INFERD_RETURN_IF_ERROR(get_bool(body, "ignore_eos", &p.ignore_eog));  // llama-server's extension
  INFERD_RETURN_IF_ERROR(get_bool(body, "cache_prompt", &p.cache_prompt));  // llama-server's extension
  INFERD_RETURN_IF_ERROR(get_logprobs(body, endpoint, &p.logprobs));
  INFERD_RETURN_IF_ERROR(get_keep_alive(body, &r.keep_alive_s));
  // The HTTP layer paces its events by the daemon's stream-interval (http_server.cpp).
  return r;
}

const char* finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::kEndOfGeneration:
    case FinishReason::kStop: return "stop";
    case FinishReason::kMaxTokens:
    case FinishReason::kContextFull: return "length";
  }
  return "stop";
}

ResponseId new_response_id(Endpoint endpoint, const std::string& model) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t boot = static_cast<uint64_t>(unix_now());
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s-%llx%06llx", endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl",
                static_cast<unsigned long long>(boot), static_cast<unsigned long long>(counter.fetch_add(1) + 1));
  return ResponseId{buf, unix_now(), model};
}

std::string response_body(Endpoint endpoint, const ResponseId& rid, const std::string& text, const GenerateSummary& s,
                          Logprobs logprobs) {
  json j = base(endpoint, rid, false);
  json choice{{"index", 0}, {"finish_reason", finish_reason(s.reason)}, {"logprobs", logprobs_json(endpoint, logprobs)}};
  if (endpoint == Endpoint::kChat) {
    choice["message"] = json{{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = usage(s);
  return dump(j);
}

std::string chunk_event(Endpoint endpoint, const ResponseId& rid, const std::string& text, bool first,
                        Logprobs logprobs) {
  json j = base(endpoint, rid, true);
  json choice{{"index", 0}, {"finish_reason", nullptr}, {"logprobs", logprobs_json(endpoint, logprobs)}};
  if (endpoint == Endpoint::kChat) {
    json delta{{"content", text}};
    if (first) delta["role"] = "assistant";
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  return event(j);
}

std::string finish_event(Endpoint endpoint, const ResponseId& rid, FinishReason reason) {
  json j = base(endpoint, rid, true);
  json choice{{"index", 0}, {"finish_reason", finish_reason(reason)}, {"logprobs", nullptr}};
  if (endpoint == Endpoint::kChat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  j["choices"] = json::array({choice});
  return event(j);
}

std::string usage_event(Endpoint endpoint, const ResponseId& rid, const GenerateSummary& s) {
  json j = base(endpoint, rid, true);
  j["choices"] = json::array();
  j["usage"] = usage(s);
  return event(j);
}

std::string done_event() { return "data: [DONE]\n\n"; }

std::string error_event(const Status& s) {
  const Error e = error_for(s);
  return "data: " + e.body + "\n\n";
}

Error error(unsigned http_status, std::string_view type, std::string_view message, std::string_view code) {
  json err{{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!code.empty()) err["code"] = code;
  return Error{http_status, dump(json{{"error", err}})};
}

Error error_for(const Status& s) {
  const std::string& m = s.message();
  switch (s.code()) {
    case Code::kInvalidArgument:
    case Code::kCorrupt: return error(400, "invalid_request_error", m);
    case Code::kNotFound: return error(404, "invalid_request_error", m, "model_not_found");
    case Code::kOutOfRange:
      if (m.find("bytes") != std::string::npos) return error(413, "invalid_request_error", m, "request_too_large");
      return error(400, "invalid_request_error", m, "context_length_exceeded");
    case Code::kUnimplemented: return error(400, "invalid_request_error", m, "unsupported_parameter");
    case Code::kOverloaded: return error(429, "rate_limit_error", m, "overloaded");
    case Code::kDisconnected: return error(503, "server_error", m, "unavailable");
    default: return error(500, "server_error", m);
  }
}

Result<EmbeddingRequest> parse_embedding_request(std::string_view text, uint32_t max_text_bytes) {
  json body;
  INFERD_RETURN_IF_ERROR(parse_body(text, &body));
  EmbeddingRequest r;
  INFERD_RETURN_IF_ERROR(get_model(body, &r.model));
  if (const json* f = field(body, "encoding_format")) {
    if (!f->is_string() || (f->get<std::string>() != "float" && f->get<std::string>() != "base64")) {
      return bad("'encoding_format' must be \"float\" or \"base64\"");
    }
    r.base64 = f->get<std::string>() == "base64";
  }
  if (field(body, "dimensions") != nullptr) {
    return Status(Code::kUnimplemented, "'dimensions': embeddings have the model's hidden size; it cannot be changed");
  }
  INFERD_RETURN_IF_ERROR(get_keep_alive(body, &r.keep_alive_s));
  const json* input = field(body, "input");
  if (input == nullptr) return bad("you must provide an 'input' parameter");
  auto one = [&](GenerateParams p) {
    p.model = r.model;
    p.embedding = true;
    p.max_tokens = 1;
    r.inputs.push_back(std::move(p));
  };
  auto tokens = [&](const json& a, const std::string& where) -> Status {
    GenerateParams p;
    p.input = GenerateParams::Input::kTokens;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_number_integer()) return wrong_type(where + "[" + std::to_string(i) + "]", "a token id", a[i]);
      const int64_t id = a[i].get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) return bad("'" + where + "[" + std::to_string(i) + "]' is not a token id");
      p.tokens.push_back(static_cast<int32_t>(id));
    }
    one(std::move(p));
    return Status::ok();
  };
  size_t text_bytes = 0;
  if (input->is_string()) {
    GenerateParams p;
    p.prompt = input->get<std::string>();
    text_bytes = p.prompt.size();
    one(std::move(p));
  } else if (input->is_array() && !input->empty() && (*input)[0].is_number()) {
    text_bytes = input->size() * 4;
    INFERD_RETURN_IF_ERROR(tokens(*input, "input"));
  } else if (input->is_array() && !input->empty()) {
    if (input->size() > kMaxEmbeddingInputs) {
      return bad("'input' holds " + std::to_string(input->size()) + " inputs; at most " +
                 std::to_string(kMaxEmbeddingInputs));
    }
    for (size_t i = 0; i < input->size(); ++i) {
      const json& x = (*input)[i];
      const std::string where = "input[" + std::to_string(i) + "]";
      if (x.is_string()) {
        GenerateParams p;
        p.prompt = x.get<std::string>();
        text_bytes += p.prompt.size();
        one(std::move(p));
      } else if (x.is_array()) {
        text_bytes += x.size() * 4;
        INFERD_RETURN_IF_ERROR(tokens(x, where));
      } else {
        return wrong_type(where, "a string or an array of token ids", x);
      }
    }
  } else {
    return wrong_type("input", "a string, an array of strings or an array of token ids", *input);
  }
  if (text_bytes > max_text_bytes) {
    return Status(Code::kOutOfRange, "the input is " + std::to_string(text_bytes) + " bytes; this daemon takes at most " +
                                         std::to_string(max_text_bytes));
  }
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const GenerateParams& p = r.inputs[i];
    if (p.input == GenerateParams::Input::kPrompt ? p.prompt.empty() : p.tokens.empty()) {
      return bad(r.inputs.size() == 1 ? std::string("'input' is empty") : "'input[" + std::to_string(i) + "]' is empty");
    }
  }
  return r;
}

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16 | uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8 |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out.push_back(kAlphabet[(v >> (6 * k)) & 63]);
  }
  if (const size_t rest = bytes.size() - i; rest > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (rest == 2) v |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::string embeddings_body(const std::string& model, const std::vector<GenerateSummary>& results, bool b64) {
  static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");
  json data = json::array();
  uint64_t prompt_tokens = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const std::vector<float>& e = results[i].embedding;
    json item{{"object", "embedding"}, {"index", i}};
    if (b64) {
      item["embedding"] = base64(std::string_view(reinterpret_cast<const char*>(e.data()), e.size() * sizeof(float)));
    } else {
      item["embedding"] = e;
    }
    data.push_back(std::move(item));
    prompt_tokens += results[i].prompt_tokens;
  }
  return dump(json{{"object", "list"},
                   {"data", data},
                   {"model", model},
                   {"usage", json{{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}});
}

std::string models_body(const std::vector<std::string>& ids) {
  json data = json::array();
  for (const std::string& id : ids) data.push_back(json{{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "inferd"}});
  return dump(json{{"object", "list"}, {"data", data}});
}

}  // namespace inferd::daemon::openai
