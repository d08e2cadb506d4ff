// Type table for inferd/dtype.h.
#include "inferd/dtype.h"

#include "inferd/status.h"

namespace inferd {
namespace {

// Indexed by search, not by value: the enum has gaps (ggml's removed types).
constexpr DTypeInfo kTypes[] = {
    {DType::kF32, "F32", 1, 4, true},
    {DType::kF16, "F16", 1, 2, true},
    {DType::kQ4_0, "Q4_0", kQK4_0, sizeof(BlockQ4_0), true},
    {DType::kQ4_1, "Q4_1", kQK4_1, sizeof(BlockQ4_1), true},
    {DType::kQ5_0, "Q5_0", kQK5_0, sizeof(BlockQ5_0), true},
    {DType::kQ5_1, "Q5_1", kQK5_1, sizeof(BlockQ5_1), true},
    {DType::kQ8_0, "Q8_0", kQK8_0, sizeof(BlockQ8_0), true},
    {DType::kQ8_1, "Q8_1", kQK8_1, sizeof(BlockQ8_1), false},
    {DType::kQ2_K, "Q2_K", kQK_K, sizeof(BlockQ2_K), true},
    {DType::kQ3_K, "Q3_K", kQK_K, sizeof(BlockQ3_K), true},
    {DType::kQ4_K, "Q4_K", kQK_K, sizeof(BlockQ4_K), true},
    {DType::kQ5_K, "Q5_K", kQK_K, sizeof(BlockQ5_K), true},
    {DType::kQ6_K, "Q6_K", kQK_K, sizeof(BlockQ6_K), true},
    {DType::kQ8_K, "Q8_K", kQK_K, sizeof(BlockQ8_K), false},
    {DType::kIQ4_NL, "IQ4_NL", kQK4_NL, sizeof(BlockIQ4_NL), true},
    {DType::kIQ4_XS, "IQ4_XS", kQK_K, sizeof(BlockIQ4_XS), true},
    {DType::kBF16, "BF16", 1, 2, true},
};

}  // namespace

const DTypeInfo* dtype_info(uint32_t raw) {
  for (const DTypeInfo& info : kTypes) {
    if (static_cast<uint32_t>(info.type) == raw) return &info;
  }
  return nullptr;
}

const char* dtype_name(DType t) {
  const DTypeInfo* info = dtype_info(t);
  return info ? info->name : "unknown";
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeInfo* info = dtype_info(t);
  INFERD_ASSERT(info != nullptr, "unknown type");
  INFERD_ASSERT(n >= 0 && n % info->block_size == 0, "row length not a multiple of the block size");
  return static_cast<size_t>(n / info->block_size) * info->block_bytes;
}

}  // namespace inferd
