// The storage record (storage_record.h): what a measurement wrote is read back as written, and a record
// that is damaged or belongs to another device, driver, configuration or graph is refused (kCorrupt),
// never used.
#include "inferd/opencl/storage_record.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

namespace inferd::opencl {
namespace {

StorageKey key() {
  return StorageKey{"NVIDIA H200", "NVIDIA Corporation", "580.95.05", "float f32 float-dot storage=timed decode=timed",
                    0x5f0c3a9e81d2b4c7};
}

StorageRecord record() {
  return fastest({StorageTrial{StorageType::kTexture2D, 1, {1, 1}, 3.0521},
                  StorageTrial{StorageType::kImageBuffer, 1, {1, 1}, 3.2010},
                  StorageTrial{StorageType::kBuffer, 1, {1, 1}, 2.9100}, StorageTrial{StorageType::kBuffer, 1, {4, 1}, 2.7050}});
}

TEST(StorageRecord, FastestIsTheChoice) {
  const StorageRecord r = record();
  EXPECT_EQ(r.storage, StorageType::kBuffer);
  EXPECT_EQ(r.parts, 1);
  EXPECT_EQ(r.decode, (DecodeShape{4, 1}));
  ASSERT_EQ(r.trials.size(), 4u);
  EXPECT_EQ(r.trials[0].storage, StorageType::kTexture2D);  // in the order timed
  const StorageRecord split =
      fastest({StorageTrial{StorageType::kTexture2DSplit, 3, {2, 2}, 1.0}, StorageTrial{StorageType::kBuffer, 1, {}, 1.5}});
  EXPECT_EQ(split.storage, StorageType::kTexture2DSplit);
  EXPECT_EQ(split.parts, 3);
  EXPECT_EQ(split.decode, (DecodeShape{2, 2}));
}

TEST(StorageRecord, FormatsAsDocumentedAndParsesBack) {
  const std::string text = format_storage_record(key(), record());
  EXPECT_EQ(text,
            "inferd-opencl-storage 1\n"
            "device NVIDIA H200\n"
            "vendor NVIDIA Corporation\n"
            "driver 580.95.05\n"
            "config float f32 float-dot storage=timed decode=timed\n"
            "graph 5f0c3a9e81d2b4c7\n"
            "trial texture2d 1 1x1 3.0521\n"
            "trial image_buffer 1 1x1 3.2010\n"
            "trial buffer 1 1x1 2.9100\n"
            "trial buffer 1 4x1 2.7050\n"
            "choice buffer 1 4x1\n"
            "end\n");
  auto back = parse_storage_record(text, key());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back.value(), record());
}

TEST(StorageRecord, RefusesAnotherKey) {
  const std::string text = format_storage_record(key(), record());
  StorageKey other = key();
  other.driver_version = "580.105.08";
  EXPECT_EQ(parse_storage_record(text, other).status().code(), Code::kCorrupt);
  other = key();
  other.graph ^= 1;
  EXPECT_EQ(parse_storage_record(text, other).status().code(), Code::kCorrupt);
  other = key();
  other.config = "float f16 float-dot storage=timed decode=timed";
  EXPECT_EQ(parse_storage_record(text, other).status().code(), Code::kCorrupt);
  EXPECT_NE(other.file_name(), key().file_name());
  EXPECT_EQ(key().file_name().substr(0, 8), "storage-");
  EXPECT_EQ(key().file_name().size(), 8u + 16u + 4u);
}

TEST(StorageRecord, RefusesDamage) {
  const std::string good = format_storage_record(key(), record());
  auto refused = [&](const std::string& text, const char* why) {
    auto r = parse_storage_record(text, key());
    EXPECT_FALSE(r.is_ok()) << why;
    if (!r) {
      EXPECT_EQ(r.status().code(), Code::kCorrupt) << why;
      EXPECT_NE(r.status().message().find("storage record"), std::string::npos) << r.status().message();
    }
  };
  // Every proper prefix (a write cut short) is refused.
  for (size_t n = 0; n < good.size(); ++n) refused(good.substr(0, n), "truncated");
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  refused(replaced("inferd-opencl-storage 1", "inferd-opencl-storage 2"), "version");
  refused(replaced("choice buffer 1 4x1", "choice texture3d 1 4x1"), "a choice not timed");
  refused(replaced("choice buffer 1 4x1", "choice buffer 2 4x1"), "a choice's parts not timed");
  refused(replaced("choice buffer 1 4x1", "choice buffer 1 2x2"), "a choice's shape not timed");
  refused(replaced("choice buffer 1 4x1", "choice buffer 1"), "a choice without its shape");
  refused(replaced("choice buffer 1 4x1\n", ""), "no choice");
  refused(replaced("trial buffer 1 1x1 2.9100", "trial bufer 1 1x1 2.9100"), "unknown storage");
  refused(replaced("trial buffer 1 1x1 2.9100", "trial buffer 1 1x1 -2.9"), "negative time");
  refused(replaced("trial buffer 1 1x1 2.9100", "trial buffer 1 1x1 2.91x"), "not a number");
  refused(replaced("trial buffer 1 1x1 2.9100", "trial buffer 0 1x1 2.9100"), "no parts");
  refused(replaced("trial buffer 1 1x1 2.9100", "trial buffer 1 9x1 2.9100"), "a shape out of range");
  refused(replaced("trial buffer 1 1x1 2.9100", "trial buffer 1 2.9100"), "a trial without its shape");
  refused(replaced("trial buffer 1 1x1 2.9100", "trial buffer 1 1x1  2.9100"), "two spaces");
  refused(replaced("trial texture2d 1 1x1 3.0521\n", "trial texture2d 1 1x1 3.0521\nwhatever\n"), "an unknown line");
  refused(good + "trial buffer 1 1x1 1.0\n", "text after the end");
  refused(replaced("choice buffer 1 4x1\n", "choice buffer 1 4x1\ntrial buffer 1 1x1 1.0\n"), "a trial after the choice");
}

TEST(StorageRecord, StoresAndLoadsInADirectory) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("inferd-storage-record-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(load_storage_record(dir.string(), key()).status().code(), Code::kNotFound);
  ASSERT_TRUE(store_storage_record(dir.string(), key(), record()).is_ok());  // creates the directory
  auto back = load_storage_record(dir.string(), key());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back.value(), record());
  // Nothing but the record is left behind (the temporary file was renamed into place).
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  // A damaged file is kCorrupt and names itself.
  { std::ofstream(dir / key().file_name(), std::ios::trunc) << "inferd-opencl-storage 1\ndevice NVIDIA"; }
  auto damaged = load_storage_record(dir.string(), key());
  EXPECT_EQ(damaged.status().code(), Code::kCorrupt);
  EXPECT_NE(damaged.status().message().find(key().file_name()), std::string::npos) << damaged.status().message();
  std::filesystem::remove_all(dir);
}

// The signature tells graphs apart by what they compute, not by where they live.
TEST(StorageRecord, GraphSignatureFollowsTheGraph) {
  auto make = [](int64_t cols, DType w) {
    static WeightView views[2];
    graph::Graph g;
    WeightView& v = views[w == DType::kQ4_0 ? 0 : 1];
    v.type = w;
    v.rows = 8;
    v.cols = cols;
    graph::Tensor x;
    x.name = "x";
    x.kind = graph::TensorKind::kInput;
    x.cols = cols;
    const graph::TensorId xi = g.add_tensor(x);
    graph::Tensor wt;
    wt.name = "w";
    wt.kind = graph::TensorKind::kWeight;
    wt.elem = graph::Elem::kWeight;
    wt.rows = graph::Rows::kFixed;
    wt.fixed_rows = 8;
    wt.cols = cols;
    wt.weight = &v;
    const graph::TensorId wi = g.add_tensor(wt);
    graph::Tensor y;
    y.name = "y";
    y.cols = 8;
    const graph::TensorId yi = g.add_tensor(y);
    graph::Node n;
    n.op = graph::Op::kMatmul;
    n.in[0] = xi;
    n.in[1] = wi;
    n.out[0] = yi;
    g.add_node(n);
    return graph_signature(g);
  };
  EXPECT_EQ(make(64, DType::kQ4_0), make(64, DType::kQ4_0));
  EXPECT_NE(make(64, DType::kQ4_0), make(64, DType::kQ8_0));
  EXPECT_NE(make(64, DType::kQ4_0), make(96, DType::kQ4_0));
}

}  // namespace
}  // namespace inferd::opencl
