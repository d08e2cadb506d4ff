#include "inferd/weight_layout.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "inferd/status.h"

namespace inferd {
namespace {

// A block as the interleaved layout sees it: `fields` 16-bit header fields, then `quant_bytes` of quants.
struct BlockShape {
  int fields;
  size_t quant_bytes;
};

BlockShape shape_of(DType type) {
  switch (type) {
    case DType::kQ4_0: return {1, sizeof(BlockQ4_0::qs)};
    case DType::kQ4_1: return {2, sizeof(BlockQ4_1::qs)};
    case DType::kQ8_0: return {1, sizeof(BlockQ8_0::qs)};
    default: INFERD_ASSERT(false, "%s has no interleaved layout", dtype_name(type)); return {0, 0};
  }
}
static_assert(sizeof(BlockQ4_0) == 2 + 16 && sizeof(BlockQ4_1) == 4 + 16 && sizeof(BlockQ8_0) == 2 + 32);

// The byte offsets, inside one block column of a group, of row j's field f and of its quants.
size_t field_offset(int f, int64_t j) { return static_cast<size_t>(f) * 2 * kInterleaveRows + 2 * static_cast<size_t>(j); }
size_t quant_offset(const BlockShape& s, int64_t j) {
  return static_cast<size_t>(s.fields) * 2 * kInterleaveRows + static_cast<size_t>(j) * s.quant_bytes;
}

// Block b of row j in the row layout (`block`) -> its place in block column b of the group (`column`).
void to_column(const BlockShape& s, const uint8_t* block, uint8_t* column, int64_t j) {
  for (int f = 0; f < s.fields; ++f) std::memcpy(column + field_offset(f, j), block + 2 * f, 2);
  std::memcpy(column + quant_offset(s, j), block + 2 * s.fields, s.quant_bytes);
}
// The inverse: row j's block from block column `column`.
void from_column(const BlockShape& s, const uint8_t* column, uint8_t* block, int64_t j) {
  for (int f = 0; f < s.fields; ++f) std::memcpy(block + 2 * f, column + field_offset(f, j), 2);
  std::memcpy(block + 2 * s.fields, column + quant_offset(s, j), s.quant_bytes);
}

template <bool kInterleave>
void convert_groups(DType type, int64_t cols, int64_t groups, const uint8_t* src, uint8_t* dst) {
  const BlockShape s = shape_of(type);
  const size_t block_bytes = dtype_info(type)->block_bytes;
  const size_t row_bytes = dtype_row_bytes(type, cols);
  const int64_t nb = cols / dtype_info(type)->block_size;
  const size_t column_bytes = kInterleaveRows * block_bytes;
  for (int64_t g = 0; g < groups; ++g) {
    const size_t base = static_cast<size_t>(g) * kInterleaveRows * row_bytes;
    for (int64_t j = 0; j < kInterleaveRows; ++j) {
      for (int64_t b = 0; b < nb; ++b) {
        const size_t row_at = base + static_cast<size_t>(j) * row_bytes + static_cast<size_t>(b) * block_bytes;
        const size_t col_at = base + static_cast<size_t>(b) * column_bytes;
        if constexpr (kInterleave) {
          to_column(s, src + row_at, dst + col_at, j);
        } else {
          from_column(s, src + col_at, dst + row_at, j);
        }
      }
    }
  }
}

}  // namespace

const char* weight_layout_name(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::kRows: return "rows";
    case WeightLayout::kInterleaved16: return "interleaved16";
  }
  return "?";
}

bool interleavable(DType type) { return type == DType::kQ4_0 || type == DType::kQ4_1 || type == DType::kQ8_0; }

bool layout_fits(WeightLayout layout, DType type, int64_t rows, int64_t cols) {
  switch (layout) {
    case WeightLayout::kRows: return true;
    case WeightLayout::kInterleaved16:
      return interleavable(type) && rows > 0 && rows % kInterleaveRows == 0 && cols > 0 &&
             cols % dtype_info(type)->block_size == 0;
  }
  return false;
}

void interleave_groups(DType type, int64_t cols, int64_t groups, const uint8_t* src, uint8_t* dst) {
  convert_groups<true>(type, cols, groups, src, dst);
}

void deinterleave_groups(DType type, int64_t cols, int64_t groups, const uint8_t* src, uint8_t* dst) {
  convert_groups<false>(type, cols, groups, src, dst);
}

void copy_row(DType type, WeightLayout layout, int64_t cols, const uint8_t* data, int64_t r, uint8_t* dst) {
  const size_t row_bytes = dtype_row_bytes(type, cols);
  if (layout == WeightLayout::kRows) {
    std::memcpy(dst, data + static_cast<size_t>(r) * row_bytes, row_bytes);
    return;
  }
  INFERD_ASSERT(layout == WeightLayout::kInterleaved16, "unknown layout");
  const BlockShape s = shape_of(type);
  const size_t block_bytes = dtype_info(type)->block_bytes;
  const int64_t nb = cols / dtype_info(type)->block_size;
  const uint8_t* group = data + static_cast<size_t>(r / kInterleaveRows) * kInterleaveRows * row_bytes;
  const int64_t j = r % kInterleaveRows;
  for (int64_t b = 0; b < nb; ++b) {
    from_column(s, group + static_cast<size_t>(b) * kInterleaveRows * block_bytes, dst + static_cast<size_t>(b) * block_bytes, j);
  }
}

bool for_each_row_layout_piece(DType type, WeightLayout layout, int64_t rows, int64_t cols, const uint8_t* data,
                               const std::function<bool(size_t, const uint8_t*, size_t)>& sink) {
  const size_t row_bytes = dtype_row_bytes(type, cols);
  if (layout == WeightLayout::kRows) return sink(0, data, static_cast<size_t>(rows) * row_bytes);
  INFERD_ASSERT(layout_fits(layout, type, rows, cols), "layout does not fit the matrix");
  const size_t group_bytes = kInterleaveRows * row_bytes;
  const int64_t groups = rows / kInterleaveRows;
  const int64_t per_piece = std::max<int64_t>(1, static_cast<int64_t>((size_t{8} << 20) / group_bytes));
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(per_piece, groups)) * group_bytes);
  for (int64_t g = 0; g < groups; g += per_piece) {
    const int64_t n = std::min(per_piece, groups - g);
    const size_t offset = static_cast<size_t>(g) * group_bytes;
    deinterleave_groups(type, cols, n, data + offset, buf.data());
    if (!sink(offset, buf.data(), static_cast<size_t>(n) * group_bytes)) return false;
  }
  return true;
}

}  // namespace inferd
