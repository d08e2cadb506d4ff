// Opens every file of the corrupt-GGUF set (tests/data/corrupt, listed in MANIFEST.tsv with the
// expected code and a substring of the expected message) and checks the reader rejects each one
// cleanly. Then mutates the set's valid base file — every truncation, and seeded random byte
// overwrites — and checks that whatever opens can be fully read. Run under ASan+UBSan as well.

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "inferd/gguf.h"

namespace inferd::gguf {
namespace {

const std::string kDir = INFERD_GGUF_CORRUPT_DIR;

struct Case {
  std::string file;
  std::string code;
  std::string substring;
};

std::vector<Case> read_manifest() {
  std::vector<Case> cases;
  std::ifstream in(kDir + "/MANIFEST.tsv");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    Case c;
    std::getline(fields, c.file, '\t');
    std::getline(fields, c.code, '\t');
    std::getline(fields, c.substring, '\t');
    cases.push_back(c);
  }
  return cases;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Reads everything an opened file offers, so the sanitizers see every access path.
void touch_everything(const GgufFile& f) {
  for (const std::string& key : f.keys()) {
    ASSERT_TRUE(f.has_key(key));
    (void)f.value_to_string(key, 200);
    (void)f.get_string(key);
    (void)f.get_u32(key);
    (void)f.get_i64(key);
    (void)f.get_f32(key);
    (void)f.get_bool(key);
    (void)f.get_array_info(key);
    (void)f.get_string_array(key);
    (void)f.get_f32_array(key);
    (void)f.get_i32_array(key);
  }
  uint64_t sum = 0;
  for (const TensorInfo& t : f.tensors()) {
    ASSERT_EQ(f.find_tensor(t.name), &t);
    ASSERT_GE(t.data, f.data());
    ASSERT_LE(t.data + t.nbytes, f.data() + f.file_size());
    for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
  }
  (void)sum;
}

TEST(GgufCorruptTest, ManifestCoversTheSet) {
  auto cases = read_manifest();
  EXPECT_GE(cases.size(), 31u) << "MANIFEST.tsv in " << kDir;
}

TEST(GgufCorruptTest, EveryFileFailsWithTheExpectedError) {
  auto cases = read_manifest();
  ASSERT_FALSE(cases.empty());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    std::string path = kDir + "/" + c.file;
    auto r = GgufFile::open(path);
    if (c.code == "OK") {
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      touch_everything(*r.value());
      continue;
    }
    ASSERT_FALSE(r.is_ok()) << "opened without error";
    EXPECT_STREQ(code_name(r.status().code()), c.code.c_str()) << r.status().to_string();
    const std::string& msg = r.status().message();
    EXPECT_NE(msg.find(c.substring), std::string::npos) << "message: " << msg << "\nwanted: " << c.substring;
    EXPECT_EQ(msg.rfind(path, 0), 0u) << "message does not start with the path: " << msg;

    // The same bytes through from_buffer give the same verdict.
    auto b = GgufFile::from_buffer(read_bytes(path), c.file);
    ASSERT_FALSE(b.is_ok());
    EXPECT_EQ(b.status().code(), r.status().code());
    EXPECT_NE(b.status().message().find(c.substring), std::string::npos) << b.status().message();
  }
}

TEST(GgufCorruptTest, EveryTruncationOfTheValidFileFails) {
  std::vector<uint8_t> base = read_bytes(kDir + "/valid_base.gguf");
  ASSERT_GT(base.size(), 64u);
  ASSERT_TRUE(GgufFile::from_buffer(base, "valid_base.gguf").is_ok());
  for (size_t n = 0; n < base.size(); ++n) {
    std::vector<uint8_t> cut(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(n));
    auto r = GgufFile::from_buffer(std::move(cut), "cut.gguf");
    // The base file ends with tensor data, so every proper prefix is missing something.
    ASSERT_FALSE(r.is_ok()) << "prefix of " << n << " bytes opened";
    ASSERT_EQ(r.status().code(), Code::kCorrupt) << r.status().to_string();
  }
}

TEST(GgufCorruptTest, RandomMutationsNeverCrash) {
  std::vector<uint8_t> base = read_bytes(kDir + "/valid_base.gguf");
  ASSERT_FALSE(base.empty());
  std::mt19937_64 rng(20240611);
  const uint8_t kInteresting[] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x07, 0x08, 0x09, 0x0c, 0x0d,
                                  0x1f, 0x20, 0x3f, 0x40, 0x7f, 0x80, 0xfe, 0xff};
  int opened = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> bytes = base;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % bytes.size();
      bytes[at] = rng() % 2 ? kInteresting[rng() % sizeof(kInteresting)] : static_cast<uint8_t>(rng());
    }
    auto r = GgufFile::from_buffer(std::move(bytes), "mutant.gguf");
    if (r.is_ok()) {
      ++opened;
      touch_everything(*r.value());
    } else {
      ASSERT_EQ(r.status().code(), Code::kCorrupt) << r.status().to_string();
    }
  }
  // Most single-byte changes land in tensor data or string bytes and leave the file valid.
  EXPECT_GT(opened, 0);
}

}  // namespace
}  // namespace inferd::gguf
