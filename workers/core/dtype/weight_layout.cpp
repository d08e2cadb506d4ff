#include "inferd/weight_layout.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "inferd/status.h"

namespace inferd {
namespace {

// A block as the interleaved layout sees it: kFields 16-bit header fields, then kQuantBytes of quants.
template <int kFields, size_t kQuantBytes>
struct Shape {
  static constexpr size_t kBlockBytes = 2 * kFields + kQuantBytes;
  static constexpr int64_t kBlockElems = 32;
  // The byte offsets, inside one block column of a group, of row j's field f and of its quants.
  static constexpr size_t field_offset(int f, int64_t j) { return static_cast<size_t>(f) * 2 * kInterleaveRows + 2 * static_cast<size_t>(j); }
  static constexpr size_t quant_offset(int64_t j) {
    return kFields * 2 * kInterleaveRows + static_cast<size_t>(j) * kQuantBytes;
  }
  // Block b of row j in the row layout (`block`) -> its place in block column b of the group (`column`).
  static void to_column(const uint8_t* block, uint8_t* column, int64_t j) {
    for (int f = 0; f < kFields; ++f) std::memcpy(column + field_offset(f, j), block + 2 * f, 2);
    std::memcpy(column + quant_offset(j), block + 2 * kFields, kQuantBytes);
  }
  // The inverse: row j's block from block column `column`.
  static void from_column(const uint8_t* column, uint8_t* block, int64_t j) {
    for (int f = 0; f < kFields; ++f) std::memcpy(block + 2 * f, column + field_offset(f, j), 2);
    std::memcpy(block + 2 * kFields, column + quant_offset(j), kQuantBytes);
  }
};
using ShapeQ4_1 = Shape<2, sizeof(BlockQ4_1::qs)>;
using ShapeQ8_0 = Shape<1, sizeof(BlockQ8_0::qs)>;
static_assert(ShapeQ4_1::kBlockBytes == sizeof(BlockQ4_1) && ShapeQ8_0::kBlockBytes == sizeof(BlockQ8_0));

// Q4_0: its own column arrangement (Q4_0Column): the quants in 4-byte pieces, the 16 rows' pieces side by side.
struct ShapeQ4_0 {
  static constexpr size_t kBlockBytes = sizeof(BlockQ4_0);
  static constexpr int64_t kBlockElems = 32;
  static void to_column(const uint8_t* block, uint8_t* column, int64_t j) {
    const auto& b = *reinterpret_cast<const BlockQ4_0*>(block);
    std::memcpy(column + Q4_0Column::d(j), &b.d, 2);
    for (int c = 0; c < 4; ++c) std::memcpy(column + Q4_0Column::qs(j, c), b.qs + 4 * c, 4);
  }
  static void from_column(const uint8_t* column, uint8_t* block, int64_t j) {
    auto& b = *reinterpret_cast<BlockQ4_0*>(block);
    std::memcpy(&b.d, column + Q4_0Column::d(j), 2);
    for (int c = 0; c < 4; ++c) std::memcpy(b.qs + 4 * c, column + Q4_0Column::qs(j, c), 4);
  }
};

// Q5_0: its own column arrangement (Q5_0Column): qh split into its two 16-bit halves.
struct ShapeQ5_0 {
  static constexpr size_t kBlockBytes = sizeof(BlockQ5_0);
  static constexpr int64_t kBlockElems = 32;
  static void to_column(const uint8_t* block, uint8_t* column, int64_t j) {
    const auto& b = *reinterpret_cast<const BlockQ5_0*>(block);
    std::memcpy(column + Q5_0Column::d(j), &b.d, 2);
    std::memcpy(column + Q5_0Column::qh(j, 0), b.qh, 2);
    std::memcpy(column + Q5_0Column::qh(j, 1), b.qh + 2, 2);
    std::memcpy(column + Q5_0Column::qs(j), b.qs, sizeof(b.qs));
  }
  static void from_column(const uint8_t* column, uint8_t* block, int64_t j) {
    auto& b = *reinterpret_cast<BlockQ5_0*>(block);
    std::memcpy(&b.d, column + Q5_0Column::d(j), 2);
    std::memcpy(b.qh, column + Q5_0Column::qh(j, 0), 2);
    std::memcpy(b.qh + 2, column + Q5_0Column::qh(j, 1), 2);
    std::memcpy(b.qs, column + Q5_0Column::qs(j), sizeof(b.qs));
  }
};

// Q4_K: its own column arrangement (Q4KColumn): the scales byte by byte and the quants in 4-byte pieces, the 16
// rows' side by side.
struct ShapeQ4_K {
  static constexpr size_t kBlockBytes = sizeof(BlockQ4_K);
  static constexpr int64_t kBlockElems = kQK_K;
  static void to_column(const uint8_t* block, uint8_t* column, int64_t j) {
    const auto& b = *reinterpret_cast<const BlockQ4_K*>(block);
    std::memcpy(column + Q4KColumn::d(j), &b.d, 2);
    std::memcpy(column + Q4KColumn::dmin(j), &b.dmin, 2);
    for (int i = 0; i < 12; ++i) column[Q4KColumn::scale(j, i)] = b.scales[i];
    for (int c = 0; c < 4; ++c) {
      for (int t = 0; t < 8; ++t) std::memcpy(column + Q4KColumn::qs(j, c, t), b.qs + 32 * c + 4 * t, 4);
    }
  }
  static void from_column(const uint8_t* column, uint8_t* block, int64_t j) {
    auto& b = *reinterpret_cast<BlockQ4_K*>(block);
    std::memcpy(&b.d, column + Q4KColumn::d(j), 2);
    std::memcpy(&b.dmin, column + Q4KColumn::dmin(j), 2);
    for (int i = 0; i < 12; ++i) b.scales[i] = column[Q4KColumn::scale(j, i)];
    for (int c = 0; c < 4; ++c) {
      for (int t = 0; t < 8; ++t) std::memcpy(b.qs + 32 * c + 4 * t, column + Q4KColumn::qs(j, c, t), 4);
    }
  }
};

// Q5_K: its own column arrangement (Q5KColumn): each row pair's qh before its quant chunks.
struct ShapeQ5_K {
  static constexpr size_t kBlockBytes = sizeof(BlockQ5_K);
  static constexpr int64_t kBlockElems = kQK_K;
  static void to_column(const uint8_t* block, uint8_t* column, int64_t j) {
    const auto& b = *reinterpret_cast<const BlockQ5_K*>(block);
    std::memcpy(column + Q5KColumn::d(j), &b.d, 2);
    std::memcpy(column + Q5KColumn::dmin(j), &b.dmin, 2);
    std::memcpy(column + Q5KColumn::scales(j), b.scales, sizeof(b.scales));
    std::memcpy(column + Q5KColumn::qh(j), b.qh, sizeof(b.qh));
    for (int c = 0; c < 4; ++c) std::memcpy(column + Q5KColumn::qs(j, c), b.qs + 32 * c, 32);
  }
  static void from_column(const uint8_t* column, uint8_t* block, int64_t j) {
    auto& b = *reinterpret_cast<BlockQ5_K*>(block);
    std::memcpy(&b.d, column + Q5KColumn::d(j), 2);
    std::memcpy(&b.dmin, column + Q5KColumn::dmin(j), 2);
    std::memcpy(b.scales, column + Q5KColumn::scales(j), sizeof(b.scales));
    std::memcpy(b.qh, column + Q5KColumn::qh(j), sizeof(b.qh));
    for (int c = 0; c < 4; ++c) std::memcpy(b.qs + 32 * c, column + Q5KColumn::qs(j, c), 32);
  }
};

// Q6_K: its own column arrangement (Q6KColumn).
struct ShapeQ6_K {
  static constexpr size_t kBlockBytes = sizeof(BlockQ6_K);
  static constexpr int64_t kBlockElems = kQK_K;
  static const uint8_t* chunk_of(const BlockQ6_K& b, int k) { return k < 4 ? b.ql + 32 * k : b.qh + 32 * (k - 4); }
  static uint8_t* chunk_of(BlockQ6_K& b, int k) { return k < 4 ? b.ql + 32 * k : b.qh + 32 * (k - 4); }
  static void to_column(const uint8_t* block, uint8_t* column, int64_t j) {
    const auto& b = *reinterpret_cast<const BlockQ6_K*>(block);
    std::memcpy(column + Q6KColumn::d(j), &b.d, 2);
    std::memcpy(column + Q6KColumn::scales(j), b.scales, sizeof(b.scales));
    for (int k = 0; k < 6; ++k) std::memcpy(column + Q6KColumn::chunk(j, k), chunk_of(b, k), 32);
  }
  static void from_column(const uint8_t* column, uint8_t* block, int64_t j) {
    auto& b = *reinterpret_cast<BlockQ6_K*>(block);
    std::memcpy(&b.d, column + Q6KColumn::d(j), 2);
    std::memcpy(b.scales, column + Q6KColumn::scales(j), sizeof(b.scales));
    for (int k = 0; k < 6; ++k) std::memcpy(chunk_of(b, k), column + Q6KColumn::chunk(j, k), 32);
  }
};

// Calls fn.template operator()<S>() with the Shape of `type`.
template <typename Fn>
void with_shape(DType type, Fn&& fn) {
  switch (type) {
    case DType::kQ4_0: return fn.template operator()<ShapeQ4_0>();
    case DType::kQ4_1: return fn.template operator()<ShapeQ4_1>();
    case DType::kQ8_0: return fn.template operator()<ShapeQ8_0>();
    case DType::kQ5_0: return fn.template operator()<ShapeQ5_0>();
    case DType::kQ4_K: return fn.template operator()<ShapeQ4_K>();
    case DType::kQ5_K: return fn.template operator()<ShapeQ5_K>();
    case DType::kQ6_K: return fn.template operator()<ShapeQ6_K>();
    default: INFERD_ASSERT(false, "%s has no interleaved layout", dtype_name(type));
  }
}

template <typename S, bool kInterleave>
void convert_groups(int64_t cols, int64_t groups, const uint8_t* src, uint8_t* dst) {
  const int64_t nb = cols / S::kBlockElems;
  const size_t row_bytes = static_cast<size_t>(nb) * S::kBlockBytes;
  constexpr size_t kColumnBytes = kInterleaveRows * S::kBlockBytes;
  for (int64_t g = 0; g < groups; ++g) {
    const size_t base = static_cast<size_t>(g) * kInterleaveRows * row_bytes;
    for (int64_t j = 0; j < kInterleaveRows; ++j) {
      for (int64_t b = 0; b < nb; ++b) {
        const size_t row_at = base + static_cast<size_t>(j) * row_bytes + static_cast<size_t>(b) * S::kBlockBytes;
        const size_t col_at = base + static_cast<size_t>(b) * kColumnBytes;
        if constexpr (kInterleave) {
          S::to_column(src + row_at, dst + col_at, j);
        } else {
          S::from_column(src + col_at, dst + row_at, j);
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

bool interleavable(DType type) {
  return type == DType::kQ4_0 || type == DType::kQ4_1 || type == DType::kQ5_0 || type == DType::kQ8_0 ||
         type == DType::kQ4_K || type == DType::kQ5_K || type == DType::kQ6_K;
}

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
  INFERD_ASSERT(cols % dtype_info(type)->block_size == 0, "row length not a multiple of the block size");
  with_shape(type, [&]<typename S>() { convert_groups<S, true>(cols, groups, src, dst); });
}

void deinterleave_groups(DType type, int64_t cols, int64_t groups, const uint8_t* src, uint8_t* dst) {
  INFERD_ASSERT(cols % dtype_info(type)->block_size == 0, "row length not a multiple of the block size");
  with_shape(type, [&]<typename S>() { convert_groups<S, false>(cols, groups, src, dst); });
}

void copy_row(DType type, WeightLayout layout, int64_t cols, const uint8_t* data, int64_t r, uint8_t* dst) {
  const size_t row_bytes = dtype_row_bytes(type, cols);
  if (layout == WeightLayout::kRows) {
    std::memcpy(dst, data + static_cast<size_t>(r) * row_bytes, row_bytes);
    return;
  }
  INFERD_ASSERT(layout == WeightLayout::kInterleaved16, "unknown layout");
  const uint8_t* group = data + static_cast<size_t>(r / kInterleaveRows) * kInterleaveRows * row_bytes;
  const int64_t j = r % kInterleaveRows;
  with_shape(type, [&]<typename S>() {
    for (int64_t b = 0; b < cols / S::kBlockElems; ++b) {
      S::from_column(group + static_cast<size_t>(b) * kInterleaveRows * S::kBlockBytes, dst + static_cast<size_t>(b) * S::kBlockBytes, j);
    }
  });
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
