#include "openai.h"
// GCC 12 reports std::string concatenations of literals as overlapping memcpy (-Wrestrict, GCC bug
// 105329), a false positive.
#pragma GCC diagnostic ignored "-Wrestrict"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

namespace inferd::daemon::openai {
namespace {

using json = nlohmann::json;

Status bad(std::string message) { return Status(Code::kInvalidArgument, std::move(message)); }

// Text for JSON: invalid UTF-8 (a model can emit a partial character only at the very end, which the
// text output holds back; this is a second line of defence) becomes U+FFFD instead of an exception.
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

Status refuse_unsupported(const json& body, Endpoint endpoint) {
  auto present = [&](const char* name) { return field(body, name) != nullptr; };
  if (const json* v = field(body, "logprobs"); v != nullptr && !(v->is_boolean() && !v->get<bool>())) {
    return Status(Code::kUnimplemented, "'logprobs' is not supported by this server yet");
  }
  if (present("top_logprobs")) return Status(Code::kUnimplemented, "'top_logprobs' is not supported by this server yet");
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
              {"total_tokens", s.prompt_tokens + s.generated_tokens}};
}

json base(Endpoint e, const ResponseId& rid, bool chunk) {
  return json{{"id", rid.id},
              {"object", object_name(e, chunk)},
              {"created", rid.created},
              {"model", rid.model},
              {"system_fingerprint", std::string("inferd-") + INFERD_VERSION}};
}

std::string event(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace

Result<Request> parse_request(Endpoint endpoint, std::string_view text, uint32_t max_text_bytes) {
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return bad("the request body is not valid JSON");
  if (!body.is_object()) return bad("the request body must be a JSON object");
  Request r;
  r.endpoint = endpoint;
  GenerateParams& p = r.params;
  const json* model = field(body, "model");
  if (model == nullptr) return bad("you must provide a 'model' parameter");
  if (!model->is_string() || model->get<std::string>().empty()) return wrong_type("model", "a non-empty string", *model);
  p.model = model->get<std::string>();
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

std::string response_body(Endpoint endpoint, const ResponseId& rid, const std::string& text, const GenerateSummary& s) {
  json j = base(endpoint, rid, false);
  json choice{{"index", 0}, {"finish_reason", finish_reason(s.reason)}, {"logprobs", nullptr}};
  if (endpoint == Endpoint::kChat) {
    choice["message"] = json{{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = usage(s);
  return dump(j);
}

std::string chunk_event(Endpoint endpoint, const ResponseId& rid, const std::string& text, bool first) {
  json j = base(endpoint, rid, true);
  json choice{{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
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

std::string models_body(const std::vector<std::string>& ids) {
  json data = json::array();
  for (const std::string& id : ids) data.push_back(json{{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "inferd"}});
  return dump(json{{"object", "list"}, {"data", data}});
}

}  // namespace inferd::daemon::openai
