#include "inferd/opencl/storage_record.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace inferd::opencl {

namespace {

constexpr std::string_view kMagic = "inferd-opencl-storage 1";

std::string one_line(std::string s) {
  std::replace_if(s.begin(), s.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  return s;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

template <typename T>
uint64_t mix(uint64_t h, const T& v) {
  return fnv1a64(std::string_view(reinterpret_cast<const char*>(&v), sizeof(v)), h);
}

// "texture2d" -> kTexture2D; false for any other word.
bool parse_storage(std::string_view word, StorageType& out) {
  for (StorageType s : kAllStorageTypes) {
    if (word == storage_name(s)) {
      out = s;
      return true;
    }
  }
  return false;
}

// The words of a line, split at single spaces.
std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at <= line.size()) {
    const size_t sp = line.find(' ', at);
    const size_t end = sp == std::string_view::npos ? line.size() : sp;
    out.push_back(line.substr(at, end - at));
    if (sp == std::string_view::npos) break;
    at = sp + 1;
  }
  return out;
}

bool parse_int(std::string_view word, int32_t& out) {
  if (word.empty() || word.size() > 9) return false;
  int32_t v = 0;
  for (char c : word) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

bool parse_shape(std::string_view word, DecodeShape& out) {
  auto shape = parse_decode_shape(word);
  if (shape) out = shape.value();
  return shape.is_ok();
}

bool parse_ms(std::string_view word, double& out) {
  const std::string s(word);
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size() && out >= 0.0 && out < 1e9;
}

}  // namespace

StorageRecord fastest(std::vector<StorageTrial> trials) {
  INFERD_ASSERT(!trials.empty(), "no storage was timed");
  const StorageTrial& best = *std::min_element(
      trials.begin(), trials.end(), [](const StorageTrial& a, const StorageTrial& b) { return a.step_ms < b.step_ms; });
  StorageRecord r{best.storage, best.parts, best.decode, {}};
  r.trials = std::move(trials);
  return r;
}

uint64_t graph_signature(const graph::Graph& g) {
  uint64_t h = fnv1a64("inferd graph");
  for (const graph::Tensor& t : g.tensors()) {
    h = fnv1a64(t.name, h);
    h = mix(h, t.cols);
    h = mix(h, static_cast<uint8_t>(t.kind));
    h = mix(h, static_cast<uint8_t>(t.rows));
    h = mix(h, static_cast<uint32_t>(t.weight_type()));
  }
  for (const graph::Node& n : g.nodes()) {
    h = mix(h, static_cast<uint8_t>(n.op));
    for (graph::TensorId id : n.in) h = mix(h, id);
    for (graph::TensorId id : n.out) h = mix(h, id);
  }
  return h;
}

std::string StorageKey::lines() const {
  return "device " + one_line(device_name) + "\nvendor " + one_line(vendor) + "\ndriver " + one_line(driver_version) +
         "\nconfig " + one_line(config) + "\ngraph " + hex16(graph) + "\n";
}

std::string StorageKey::file_name() const { return "storage-" + hex16(fnv1a64(lines())) + ".txt"; }

std::string format_storage_record(const StorageKey& key, const StorageRecord& record) {
  std::string text = std::string(kMagic) + "\n" + key.lines();
  char buf[96];
  for (const StorageTrial& t : record.trials) {
    std::snprintf(buf, sizeof(buf), "trial %s %d %s %.4f\n", storage_name(t.storage), t.parts,
                  t.decode.to_string().c_str(), t.step_ms);
    text += buf;
  }
  text += std::string("choice ") + storage_name(record.storage) + " " + std::to_string(record.parts) + " " +
          record.decode.to_string() + "\nend\n";
  return text;
}

Result<StorageRecord> parse_storage_record(std::string_view text, const StorageKey& key) {
  auto corrupt = [](const std::string& why) { return Status(Code::kCorrupt, "storage record: " + why); };
  const std::string head = std::string(kMagic) + "\n" + key.lines();
  if (text.substr(0, kMagic.size() + 1) != std::string(kMagic) + "\n") return corrupt("not a version 1 record");
  if (text.substr(0, head.size()) != head) return corrupt("recorded for another device, driver, configuration or graph");
  text.remove_prefix(head.size());
  StorageRecord r;
  bool chosen = false, ended = false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return corrupt("truncated");
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    if (ended) return corrupt("text after its end");
    const std::vector<std::string_view> w = words(line);
    if (w.size() == 1 && w[0] == "end") {
      ended = true;
    } else if (w.size() == 5 && w[0] == "trial" && !chosen) {
      StorageTrial t;
      if (!parse_storage(w[1], t.storage) || !parse_int(w[2], t.parts) || !parse_shape(w[3], t.decode) ||
          !parse_ms(w[4], t.step_ms) || t.parts < 1 || t.parts > kMaxTextureParts) {
        return corrupt("bad trial '" + std::string(line) + "'");
      }
      r.trials.push_back(t);
    } else if (w.size() == 4 && w[0] == "choice" && !chosen) {
      if (!parse_storage(w[1], r.storage) || !parse_int(w[2], r.parts) || !parse_shape(w[3], r.decode)) {
        return corrupt("bad choice '" + std::string(line) + "'");
      }
      chosen = true;
    } else {
      return corrupt("unexpected line '" + std::string(line) + "'");
    }
  }
  if (!ended) return corrupt("truncated");
  if (!chosen) return corrupt("no choice");
  const bool among_trials = std::any_of(r.trials.begin(), r.trials.end(), [&](const StorageTrial& t) {
    return t.storage == r.storage && t.parts == r.parts && t.decode == r.decode;
  });
  if (!among_trials) {
    return corrupt(std::string("the choice ") + storage_name(r.storage) + " " + r.decode.to_string() +
                   " is not among its trials");
  }
  return r;
}

Result<StorageRecord> load_storage_record(const std::string& directory, const StorageKey& key) {
  const std::string path = (std::filesystem::path(directory) / key.file_name()).string();
  auto data = read_whole_file(path);
  if (!data) return data.status();
  auto r = parse_storage_record(
      std::string_view(reinterpret_cast<const char*>(data->data()), data->size()), key);
  if (!r) return r.status().with_context(path);
  return r;
}

Status store_storage_record(const std::string& directory, const StorageKey& key, const StorageRecord& record) {
  const std::string text = format_storage_record(key, record);
  return write_file_atomically((std::filesystem::path(directory) / key.file_name()).string(),
                               std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(text.data()),
                                                              text.size()));
}

}  // namespace inferd::opencl
