// Streams a completion from the only model loaded in a running inferd, using nothing but
// <inferd/client.h>. Usage: inferd-generate-example [PROMPT]
#include <inferd/client.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  const std::string prompt = argc > 1 ? argv[1] : "The three primary colors are";
  try {
    inferd::client::Client client;  // $INFERD_SOCKET or the default socket
    const auto models = client.list();
    if (models.size() != 1) {
      std::fprintf(stderr, "expected exactly one loaded model, found %zu\n", models.size());
      return 1;
    }
    inferd::client::GenerateRequest req;
    req.model = models[0].id;
    req.prompt = prompt;
    req.max_tokens = 32;
    req.sampling.temperature = 0;  // greedy: the same answer every run
    const auto result = client.generate(req, [](const inferd::client::TokenBatch& batch) {
      std::fwrite(batch.text.data(), 1, batch.text.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::printf("\n[%u tokens, %s]\n", result.generated_tokens, inferd::client::to_string(result.finish_reason));
    return 0;
  } catch (const inferd::client::Error& e) {
    std::fprintf(stderr, "error (%s): %s\n", inferd::client::to_string(e.kind()), e.what());
    return 1;
  }
}
