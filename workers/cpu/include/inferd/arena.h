// inferd/arena.h — plans offsets of intermediate tensors in one activation arena.
//
// Intermediate tensors of a forward pass do not all live at the same time. Given each tensor's size
// and lifetime [first_use, last_use] (in step indices), the planner assigns offsets in one buffer so
// that tensors whose lifetimes overlap never share bytes: greedy by size (ML Drift, section 3.5):
// largest first, each at the lowest offset that fits between already-placed, overlapping tensors.
//
// Invariants of a plan:
//   1. offset % alignment == 0 for every tensor;
//   2. two tensors whose lifetimes intersect occupy disjoint byte ranges;
//   3. total_bytes >= offset + bytes for every tensor.
// Thread safety: a plain value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace inferd {

class ArenaPlan {
 public:
  struct Tensor {
    std::string name;
    size_t bytes = 0;
    int first_use = 0;  // inclusive
    int last_use = 0;   // inclusive
    size_t offset = 0;  // assigned by plan()
  };

  // Adds a tensor and returns its id (index) for offset().
  int add(std::string name, size_t bytes, int first_use, int last_use);
  // Assigns offsets; call after all add()s.
  void plan(size_t alignment = 64);

  size_t offset(int id) const { return tensors_[static_cast<size_t>(id)].offset; }
  size_t total_bytes() const { return total_bytes_; }
  // Sum of all tensor sizes: what the arena would need without sharing.
  size_t naive_bytes() const;
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // A table: name, bytes, lifetime, offset; and the totals.
  std::string to_string() const;

 private:
  std::vector<Tensor> tensors_;
  size_t total_bytes_ = 0;
};

}  // namespace inferd
