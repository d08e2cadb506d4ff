// OpenAI request parsing and response formatting (openai.h), without a server.
#include "openai.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace inferd::daemon::openai {
namespace {

using json = nlohmann::json;

Result<Request> chat(const std::string& body) { return parse_request(Endpoint::kChat, body, 1 << 20); }

TEST(OpenAi, ChatRequestMapsEveryField) {
  auto r = chat(R"({"model":"m","messages":[{"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
      "stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":7,"max_tokens":99,
      "temperature":0,"top_p":0.5,"top_k":3,"min_p":0.1,"seed":42,"stop":["\n","END"],
      "frequency_penalty":0.5,"presence_penalty":-0.5,"user":"x","n":1,"logprobs":false,"tools":[]})");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const GenerateParams& p = r->params;
  EXPECT_EQ(p.model, "m");
  ASSERT_EQ(p.messages.size(), 2u);
  EXPECT_EQ(p.messages[0].role, "system");
  EXPECT_EQ(p.messages[1].content, "hi there");
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(p.max_tokens, 7u);  // max_completion_tokens wins
  EXPECT_EQ(p.sampling.temperature, 0.0f);
  EXPECT_EQ(p.sampling.top_p, 0.5f);
  EXPECT_EQ(p.sampling.top_k, 3);
  EXPECT_EQ(p.sampling.seed, 42u);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(p.sampling.presence_penalty, -0.5f);
}

TEST(OpenAi, AbsentFieldsTakeTheDaemonsDefaults) {
  auto r = parse_request(Endpoint::kCompletions, R"({"model":"m","prompt":["once"]})", 1 << 20);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->params.prompt, "once");
  EXPECT_EQ(r->params.max_tokens, 0u);  // until the end of generation
  EXPECT_EQ(r->params.sampling.temperature, SamplingParams{}.temperature);
  EXPECT_EQ(r->params.sampling.seed, SamplingParams::kSeedFromClock);
  EXPECT_FALSE(r->stream);
}

TEST(OpenAi, BadRequestsAreRefusedNamingTheField) {
  struct Case {
    const char* body;
    const char* fragment;
    Code code;
  };
  const Case cases[] = {
      {"{", "not valid JSON", Code::kInvalidArgument},
      {"[1]", "JSON object", Code::kInvalidArgument},
      {R"({"messages":[]})", "'model'", Code::kInvalidArgument},
      {R"({"model":"m"})", "'messages'", Code::kInvalidArgument},
      {R"({"model":"m","messages":"hi"})", "'messages' must be an array", Code::kInvalidArgument},
      {R"({"model":"m","messages":[{"role":"user","content":1}]})", "messages[0].content", Code::kInvalidArgument},
      {R"({"model":"m","messages":[{"role":"tool","content":"x"}]})", "messages[0].role", Code::kUnimplemented},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "'temperature' must be a number",
       Code::kInvalidArgument},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_p":1.5})", "top_p", Code::kInvalidArgument},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-1})", "'max_tokens'", Code::kInvalidArgument},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":2})", "'n'", Code::kInvalidArgument},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true})", "logprobs", Code::kUnimplemented},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools",
       Code::kUnimplemented},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop[0]", Code::kInvalidArgument},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"})", "'stream'", Code::kInvalidArgument},
  };
  for (const Case& c : cases) {
    auto r = chat(c.body);
    ASSERT_FALSE(r.is_ok()) << c.body;
    EXPECT_EQ(r.status().code(), c.code) << c.body << ": " << r.status().to_string();
    EXPECT_NE(r.status().message().find(c.fragment), std::string::npos) << c.body << ": " << r.status().to_string();
  }
  auto big = parse_request(Endpoint::kCompletions, R"({"model":"m","prompt":")" + std::string(2000, 'a') + "\"}", 1024);
  ASSERT_FALSE(big.is_ok());
  EXPECT_EQ(error_for(big.status()).http_status, 413u);
}

TEST(OpenAi, ResponsesAndEventsAreOpenAisShapes) {
  const ResponseId rid = new_response_id(Endpoint::kChat, "m");
  EXPECT_EQ(rid.id.rfind("chatcmpl-", 0), 0u);
  GenerateSummary s;
  s.reason = FinishReason::kMaxTokens;
  s.prompt_tokens = 5;
  s.generated_tokens = 3;
  const json whole = json::parse(response_body(Endpoint::kChat, rid, "héllo", s));
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "héllo");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["total_tokens"], 8);
  const std::string ev = chunk_event(Endpoint::kChat, rid, "a", true);
  ASSERT_EQ(ev.rfind("data: ", 0), 0u);
  ASSERT_EQ(ev.substr(ev.size() - 2), "\n\n");
  const json chunk = json::parse(ev.substr(6));
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(json::parse(usage_event(Endpoint::kChat, rid, s).substr(6))["choices"].size(), 0u);
  EXPECT_EQ(done_event(), "data: [DONE]\n\n");
  // A broken UTF-8 byte becomes U+FFFD rather than an exception.
  EXPECT_NO_THROW(json::parse(chunk_event(Endpoint::kCompletions, rid, std::string("\xff"), false).substr(6)));
}

TEST(OpenAi, ErrorsMapToOpenAisStatusCodes) {
  EXPECT_EQ(error_for(Status(Code::kInvalidArgument, "x")).http_status, 400u);
  EXPECT_EQ(error_for(Status(Code::kNotFound, "no model")).http_status, 404u);
  EXPECT_EQ(error_for(Status(Code::kOverloaded, "busy")).http_status, 429u);
  EXPECT_EQ(error_for(Status(Code::kOutOfRange, "prompt of 9000 tokens")).http_status, 400u);
  const json e = json::parse(error_for(Status(Code::kNotFound, "no model 'z'")).body);
  EXPECT_EQ(e["error"]["message"], "no model 'z'");
  EXPECT_EQ(e["error"]["code"], "model_not_found");
}

}  // namespace
}  // namespace inferd::daemon::openai
