#include "inferd/arena.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "inferd/status.h"

namespace inferd {

int ArenaPlan::add(std::string name, size_t bytes, int first_use, int last_use) {
  INFERD_ASSERT(first_use <= last_use);
  tensors_.push_back(Tensor{std::move(name), bytes, first_use, last_use, 0});
  return static_cast<int>(tensors_.size() - 1);
}

void ArenaPlan::plan(size_t alignment) {
  INFERD_ASSERT(alignment > 0 && (alignment & (alignment - 1)) == 0);
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors_[a].bytes > tensors_[b].bytes; });
  auto align_up = [alignment](size_t v) { return (v + alignment - 1) & ~(alignment - 1); };

  std::vector<size_t> placed;
  total_bytes_ = 0;
  for (size_t id : order) {
    Tensor& t = tensors_[id];
    // Byte ranges of placed tensors alive at the same time, sorted by offset.
    std::vector<std::pair<size_t, size_t>> busy;
    for (size_t p : placed) {
      const Tensor& o = tensors_[p];
      if (o.first_use <= t.last_use && t.first_use <= o.last_use) busy.emplace_back(o.offset, o.offset + o.bytes);
    }
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + t.bytes <= begin) break;
      offset = std::max(offset, align_up(end));
    }
    t.offset = offset;
    total_bytes_ = std::max(total_bytes_, align_up(offset + t.bytes));
    placed.push_back(id);
  }
}

size_t ArenaPlan::naive_bytes() const {
  size_t sum = 0;
  for (const Tensor& t : tensors_) sum += t.bytes;
  return sum;
}

std::string ArenaPlan::to_string() const {
  std::string out;
  char line[256];
  for (const Tensor& t : tensors_) {
    std::snprintf(line, sizeof(line), "  %-14s %10zu B  steps %3d..%-3d  offset %10zu\n", t.name.c_str(), t.bytes,
                  t.first_use, t.last_use, t.offset);
    out += line;
  }
  std::snprintf(line, sizeof(line), "  arena %zu B (%.2f MiB); without sharing %zu B (%.2f MiB)\n", total_bytes_,
                static_cast<double>(total_bytes_) / 1048576.0, naive_bytes(),
                static_cast<double>(naive_bytes()) / 1048576.0);
  out += line;
  return out;
}

}  // namespace inferd
