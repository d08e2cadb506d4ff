// inferd/opencl/storage_record.h — the configuration of a model's decode step measured fastest on a
// device — the activations' storage and the float decode matmul's shape — cached on disk (issue 20: chosen
// by measurement, not by rule).
//
// OpenClBackend with StoragePolicy::kMeasure (cl_backend.h) times a decode step of the graph in each
// candidate storage (storage_candidates) and, with float numerics, each decode shape
// (decode_shape_candidates) at its first load and writes what it found to
// <cache dir>/storage-<16 hex digits>.txt, named by the hash of its key: the device, its driver, the
// backend's configuration and the graph. Later loads read the choice instead of timing again. A record is
// a short text file that people can read:
//
//   inferd-opencl-storage 1
//   device NVIDIA H200
//   vendor NVIDIA Corporation
//   driver 580.95.05
//   config float f32 float-dot storage=timed decode=timed
//   graph 5f0c3a9e81d2b4c7
//   trial texture2d 1 1x1 3.0521
//   trial image_buffer 1 1x1 3.2010
//   trial buffer 1 1x1 2.9100
//   trial buffer 1 4x1 2.7050
//   choice buffer 1 4x1
//   end
//
// (trial: storage, parts, decode shape, milliseconds per decode step, the median of its timed steps). A
// record is used
// only when its key lines equal the current key, its choice is one of its trials, and "end" closes it;
// anything else (truncated, another driver, an unknown storage) is kCorrupt, and the backend measures
// again and overwrites it. Records are written atomically (write_file_atomically).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/graph.h"
#include "inferd/opencl/cl_runtime.h"
#include "inferd/opencl/ops.h"
#include "inferd/opencl/tensor_desc.h"
#include "inferd/status.h"

namespace inferd::opencl {

// One configuration's time per decode step.
struct StorageTrial {
  StorageType storage = StorageType::kBuffer;
  int32_t parts = 1;
  DecodeShape decode;
  double step_ms = 0.0;
  bool operator==(const StorageTrial&) const = default;
};

// What was measured: the trials and the configuration chosen (the fastest).
struct StorageRecord {
  StorageType storage = StorageType::kBuffer;
  int32_t parts = 1;
  DecodeShape decode;
  std::vector<StorageTrial> trials;
  bool operator==(const StorageRecord&) const = default;
};

// The fastest of `trials` (the first of equal ones). Asserts that there is one.
StorageRecord fastest(std::vector<StorageTrial> trials);

// A hash of what a graph computes: every node's operator and every tensor's name, width, kind and
// weight type. Two loads of one model give the same signature; another model (or another pipeline
// stage of it) almost surely another.
uint64_t graph_signature(const graph::Graph& g);

struct StorageKey {
  std::string device_name, vendor, driver_version;
  std::string config;  // the backend's settings and what is timed ("float f32 float-dot storage=timed decode=timed")
  uint64_t graph = 0;  // graph_signature

  // The key lines of a record ("device ...\nvendor ...\n..."); line breaks in a name become spaces.
  std::string lines() const;
  // "storage-<16 hex digits of fnv1a64(lines())>.txt".
  std::string file_name() const;
};

std::string format_storage_record(const StorageKey& key, const StorageRecord& record);
// kCorrupt (saying why) unless `text` is a whole record of `key`.
Result<StorageRecord> parse_storage_record(std::string_view text, const StorageKey& key);

// <directory>/key.file_name(): kNotFound when there is none, kCorrupt as parse_storage_record.
Result<StorageRecord> load_storage_record(const std::string& directory, const StorageKey& key);
Status store_storage_record(const std::string& directory, const StorageKey& key, const StorageRecord& record);

}  // namespace inferd::opencl
