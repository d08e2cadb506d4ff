// inferd-tokenize — tokenizes text with a model's vocabulary, printing what llama.cpp's
// llama-tokenize prints.
//
//   inferd-tokenize [-m MODEL] (-p TEXT | -f FILE) [--ids] [--json] [--no-bos] [--no-parse-special]
//                   [--show-count] [--stats]
//
// Default output is one `   id -> 'piece'` line per token (control tokens rendered); --ids prints
// the ids as a list; --json prints {"n_tokens", "tokens": [{"id", "piece", "hex"}]}. --stats reports
// the tokenization time and throughput on stderr. Exit status: 0 on success, 1 on errors, 2 on bad usage.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "common/cli.h"
#include "inferd/gguf.h"
#include "inferd/tokenizer.h"

namespace {

// JSON string literal; bytes that are not valid UTF-8 become U+FFFD so the output always parses.
std::string json_string(std::string_view s) {
  std::string valid;
  inferd::Utf8Stream stream;
  valid = stream.push(s);
  valid += stream.flush();
  std::string out = "\"";
  for (const char ch : valid) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(ch);
    }
  }
  return out + "\"";
}

std::string hex(std::string_view s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : s) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = inferd::cli::default_model_path();
  std::string prompt, file;
  bool ids_only = false, json = false, no_bos = false, no_parse_special = false, show_count = false,
       stats = false;
  inferd::cli::Parser parser("inferd-tokenize", "Tokenizes text with a model's vocabulary, like llama-tokenize.");
  parser.option({"-m", "--model"}, &model, "MODEL", "GGUF model file");
  parser.option({"-p", "--prompt"}, &prompt, "TEXT", "text to tokenize");
  parser.option({"-f", "--file"}, &file, "FILE", "read the text from FILE");
  parser.flag({"--ids"}, &ids_only, "print only the token ids, as a list");
  parser.flag({"--json"}, &json, "print JSON");
  parser.flag({"--no-bos"}, &no_bos, "do not add BOS/EOS even if the model asks for them");
  parser.flag({"--no-parse-special"}, &no_parse_special, "treat control token texts as plain text");
  parser.flag({"--show-count"}, &show_count, "print the number of tokens");
  parser.flag({"--stats"}, &stats, "print tokenization time and throughput to stderr");
  if (const int rc = inferd::cli::parse_or_exit(parser, argc, argv); rc >= 0) return rc;
  if (prompt.empty() == file.empty()) {
    std::fprintf(stderr, "inferd-tokenize: give exactly one of -p TEXT or -f FILE\n%s", parser.usage().c_str());
    return 2;
  }
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "inferd-tokenize: cannot read %s\n", file.c_str());
      return 1;
    }
    prompt.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  auto gguf = inferd::gguf::GgufFile::open(model);
  if (!gguf.is_ok()) {
    std::fprintf(stderr, "inferd-tokenize: %s\n", gguf.status().to_string().c_str());
    return 1;
  }
  auto tok = inferd::Tokenizer::from_gguf(**gguf);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "inferd-tokenize: %s: %s\n", model.c_str(), tok.status().to_string().c_str());
    return 1;
  }
  const inferd::Tokenizer& t = **tok;

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = t.encode(prompt, !no_bos, !no_parse_special);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::string out;
  if (json) {
    out = "{\"n_tokens\": " + std::to_string(ids.size()) + ", \"tokens\": [";
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string piece = t.token_to_piece(ids[i], true);
      if (i) out += ", ";
      out += "{\"id\": " + std::to_string(ids[i]) + ", \"piece\": " + json_string(piece) + ", \"hex\": \"" +
             hex(piece) + "\"}";
    }
    out += "]}\n";
  } else if (ids_only) {
    out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(ids[i]);
    }
    out += "]\n";
  } else {
    char buf[32];
    for (const int32_t id : ids) {
      std::snprintf(buf, sizeof(buf), "%6d -> '", id);
      out += buf;
      out += t.token_to_piece(id, true);
      out += "'\n";
    }
  }
  if (show_count && !json) out += "Total number of tokens: " + std::to_string(ids.size()) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (stats) {
    std::fprintf(stderr, "inferd-tokenize: %zu bytes -> %zu tokens in %.3f ms (%.2f MB/s, %.0f tokens/s)\n",
                 prompt.size(), ids.size(), secs * 1e3, prompt.size() / secs / 1e6, ids.size() / secs);
  }
  return 0;
}
