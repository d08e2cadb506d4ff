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
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":3})", "needs 'logprobs'",
       Code::kInvalidArgument},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "'top_logprobs'",
       Code::kInvalidArgument},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"keep_alive":"5 parsecs"})", "'keep_alive'",
       Code::kInvalidArgument},
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

TEST(OpenAi, LogprobsAndKeepAliveAreParsedForEachEndpoint) {
  auto c = chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":5,
      "keep_alive":"5m"})");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->params.logprobs, 5);
  EXPECT_EQ(c->keep_alive_s, 300.0);
  auto none = chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":false})");
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->params.logprobs, -1);
  EXPECT_EQ(none->keep_alive_s, -1.0);
  auto plain = chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"keep_alive":-1})");
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(plain->params.logprobs, 0);  // the sampled token's only
  EXPECT_EQ(plain->keep_alive_s, 0.0);   // ollama's "forever": never unload
  auto comp = parse_request(Endpoint::kCompletions, R"({"model":"m","prompt":"x","logprobs":3,"keep_alive":90})", 1 << 20);
  ASSERT_TRUE(comp.is_ok()) << comp.status().to_string();
  EXPECT_EQ(comp->params.logprobs, 3);
  EXPECT_EQ(comp->keep_alive_s, 90.0);
}

TEST(OpenAi, LogprobsTakeEachEndpointsShape) {
  std::vector<TokenLogprobs> lp(2);
  lp[0].chosen = {7, -0.5f, "he"};
  lp[0].top = {{7, -0.5f, "he"}, {9, -1.5f, "\xc3"}};
  lp[1].chosen = {8, -0.25f, "llo"};
  const ResponseId rid = new_response_id(Endpoint::kChat, "m");
  GenerateSummary s;
  size_t offset = 0;
  const json chat_body = json::parse(response_body(Endpoint::kChat, rid, "hello", s, {true, &lp, &offset}));
  const json& content = chat_body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "he");
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], json::array({104, 101}));
  EXPECT_EQ(content[0]["top_logprobs"][1]["bytes"], json::array({195}));  // part of a character: its bytes
  EXPECT_EQ(content[1]["top_logprobs"].size(), 0u);
  const json no = json::parse(response_body(Endpoint::kChat, rid, "hello", s));
  EXPECT_TRUE(no["choices"][0]["logprobs"].is_null());
  // Completions: parallel arrays, text offsets running on across events.
  offset = 0;
  const json first = json::parse(chunk_event(Endpoint::kCompletions, rid, "he", true, {true, &lp, &offset}).substr(6));
  const json& l = first["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], json::array({"he", "llo"}));
  EXPECT_EQ(l["token_logprobs"], json::array({-0.5, -0.25}));
  EXPECT_EQ(l["top_logprobs"][0]["he"], -0.5);
  EXPECT_EQ(l["text_offset"], json::array({0, 2}));
  EXPECT_EQ(offset, 5u);
}

TEST(OpenAi, EmbeddingRequestsAndResponses) {
  auto one = parse_embedding_request(R"({"model":"m","input":"hello"})", 1 << 20);
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  ASSERT_EQ(one->inputs.size(), 1u);
  EXPECT_TRUE(one->inputs[0].embedding);
  EXPECT_EQ(one->inputs[0].prompt, "hello");
  EXPECT_EQ(one->inputs[0].model, "m");
  EXPECT_FALSE(one->base64);
  auto many = parse_embedding_request(R"({"model":"m","input":["a",[1,2,3]],"encoding_format":"base64"})", 1 << 20);
  ASSERT_TRUE(many.is_ok()) << many.status().to_string();
  ASSERT_EQ(many->inputs.size(), 2u);
  EXPECT_EQ(many->inputs[1].input, GenerateParams::Input::kTokens);
  EXPECT_EQ(many->inputs[1].tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(many->base64);
  auto ids = parse_embedding_request(R"({"model":"m","input":[4,5]})", 1 << 20);
  ASSERT_TRUE(ids.is_ok());
  ASSERT_EQ(ids->inputs.size(), 1u);
  EXPECT_EQ(ids->inputs[0].tokens, (std::vector<int32_t>{4, 5}));
  struct Case {
    const char* body;
    const char* fragment;
  };
  for (const Case& c : {Case{R"({"input":"x"})", "'model'"}, Case{R"({"model":"m"})", "'input'"},
                        Case{R"({"model":"m","input":""})", "empty"}, Case{R"({"model":"m","input":[1.5]})", "input[0]"},
                        Case{R"({"model":"m","input":{"a":1}})", "'input'"}, Case{R"({"model":"m","input":[-1]})", "token id"},
                        Case{R"({"model":"m","input":"x","encoding_format":"hex"})", "encoding_format"},
                        Case{R"({"model":"m","input":"x","dimensions":8})", "dimensions"}}) {
    auto r = parse_embedding_request(c.body, 1 << 20);
    ASSERT_FALSE(r.is_ok()) << c.body;
    EXPECT_NE(r.status().message().find(c.fragment), std::string::npos) << c.body << ": " << r.status().to_string();
  }
  EXPECT_EQ(parse_embedding_request(R"({"model":"m","input":")" + std::string(100, 'a') + "\"}", 64).status().code(),
            Code::kOutOfRange);

  std::vector<GenerateSummary> results(2);
  results[0].embedding = {1.0f, 0.0f};
  results[0].prompt_tokens = 3;
  results[1].embedding = {0.0f, -2.5f};
  results[1].prompt_tokens = 4;
  const json f = json::parse(embeddings_body("m", results, false));
  EXPECT_EQ(f["object"], "list");
  EXPECT_EQ(f["data"][1]["index"], 1);
  EXPECT_EQ(f["data"][1]["embedding"], json::array({0.0, -2.5}));
  EXPECT_EQ(f["usage"]["prompt_tokens"], 7);
  const json b = json::parse(embeddings_body("m", results, true));
  EXPECT_EQ(b["data"][0]["embedding"], "AACAPwAAAAA=");  // 1.0f, 0.0f little-endian
  EXPECT_EQ(base64("M"), "TQ==");
  EXPECT_EQ(base64("Ma"), "TWE=");
  EXPECT_EQ(base64("Man"), "TWFu");
  EXPECT_EQ(base64(""), "");
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
