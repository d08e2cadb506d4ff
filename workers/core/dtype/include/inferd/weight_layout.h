// inferd/weight_layout.h — how a weight matrix's blocks are arranged in memory.
//
// A GGUF file stores a quantized matrix row after row (WeightLayout::kRows). The CPU's decode GEMV
// reads faster from another arrangement, so the supervisor writes the matrices of some types into the
// weights segment as WeightLayout::kInterleaved16 instead (the segment's tensor table records which;
// docs/ARCHITECTURE.md draws it):
//
//   rows are taken in groups of 16 (a matrix is interleaved only when its row count is a multiple of 16);
//   group g occupies the same bytes as rows 16g..16g+15 do in the row layout (16 * row_bytes from
//   row(16 g)), so row ranges that start at a multiple of 16 keep their offsets;
//   inside a group, block column b (the b-th block of each of the 16 rows) is one record of
//   16 * block_bytes bytes at b * 16 * block_bytes:
//     Q4_1:  d[16] (fp16)  m[16] (fp16)   qs[16][16]     320 B
//     Q8_0:  d[16] (fp16)                 qs[16][32]     544 B
//   i.e. each of the block's 16-bit header fields for the 16 rows, then the 16 rows' quants, every field
//   of row j at index j. Quant bytes are unchanged (same nibble order as ggml), and Q4_1's and Q8_0's rows
//   keep theirs together; Q4_0's go in 4-byte pieces instead (Q4_0Column):
//     Q4_0:  d[16] (fp16), then for each piece c = 0..3 (quant bytes 4c..4c+3) the 16 rows' pieces:
//            row j's four bytes at 32 + 64 c + 4 j                          288 B (Q4_0Column)
//            so one 64-byte load holds the 16 rows' elements 4c..4c+3 (low nibbles) and 16+4c..16+4c+3
//            (high), a 32-byte load those of 8 rows: a byte dot per 32-bit lane is one row's, and the sums
//            over a block stay in their lanes.
//     Q5_0:  d[16] (fp16)  qh, four rows at a time: for rows 4q..4q+3 at 32 + 16 q their bits 0..15 (2
//            bytes per row), then at + 8 their bits 16..31 (the 64 bits of one AVX-512 byte mask),
//            then qs[16][16] at 96                                                  352 B (Q5_0Column)
//     Q4_K:  d[16] (fp16)  dmin[16] (fp16)  then the packed scales byte by byte: byte i (0..11) of the
//            16 rows at 64 + 16 i + j; then the quants in 4-byte pieces as Q4_0's: piece t (bytes 4t..4t+3)
//            of chunk c (32 bytes: sub-blocks 2c and 2c + 1) of the 16 rows at 256 + 512 c + 64 t + 4 j
//                                                                                   2304 B (Q4KColumn)
//            so one 64-byte load holds the 16 rows' elements 4t..4t+3 of sub-blocks 2c (low nibbles) and
//            2c + 1 (high), one row per 32-bit lane, and 192 bytes hold all 16 rows' scales and mins.
//     Q5_K:  d[16] (fp16)  dmin[16] (fp16)  scales[16][12]  then row pairs (2p, 2p + 1) at 256 + 320 p:
//            their qh (32 bytes per row: row 2p's, then row 2p + 1's), then chunk c (32 bytes: sub-blocks
//            2c and 2c + 1) of row 2p at + 64 + 64 c, of row 2p + 1 at + 64 + 64 c + 32   2816 B (Q5KColumn)
//     Q6_K:  d[16] (fp16)  scales[16][16] (int8)  then row pairs (2p, 2p + 1) at 288 + 384 p: six
//            32-byte chunks k (ql[0..31], ql[32..63], ql[64..95], ql[96..127], qh[0..31], qh[32..63]),
//            row 2p's at + 64 k, row 2p + 1's at + 64 k + 32                       3360 B (Q6KColumn)
//
// One group is one sequential stream for the GEMV (instead of 16 rows' streams), 16 scales load as one
// vector, and four rows' quants fill one 512-bit register. The bytes are a permutation of the row
// layout's within each group: interleave and deinterleave are exact inverses, and the matrix has the
// same size. GPU workers deinterleave on upload (their kernels read rows).
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "inferd/dtype.h"

namespace inferd {

enum class WeightLayout : uint32_t {
  kRows = 0,           // GGUF's
  kInterleaved16 = 1,  // groups of 16 rows, block columns of 16 blocks (above)
};
inline constexpr int64_t kInterleaveRows = 16;

// "rows" or "interleaved16"; "?" for a value outside the enum.
const char* weight_layout_name(WeightLayout layout);

// Byte offsets inside a Q4_0 block column of a group (row j = 0..15; c = 0..3: the row's quant bytes 4c..4c+3).
struct Q4_0Column {
  static constexpr size_t kBytes = 16 * 18;
  static constexpr size_t d(int64_t j) { return 2 * static_cast<size_t>(j); }
  static constexpr size_t qs(int64_t j, int c) {
    return 32 + 64 * static_cast<size_t>(c) + 4 * static_cast<size_t>(j);
  }
};
static_assert(sizeof(BlockQ4_0) == 18 && Q4_0Column::qs(0, 0) == 32 && Q4_0Column::qs(15, 3) + 4 == Q4_0Column::kBytes);

// Byte offsets inside a Q5_0 block column of a group (row j = 0..15; qh half h = 0 for bits 0..15, 1 for
// 16..31).
struct Q5_0Column {
  static constexpr size_t kBytes = 16 * 22;
  static constexpr size_t d(int64_t j) { return 2 * static_cast<size_t>(j); }
  static constexpr size_t qh(int64_t j, int h) {
    return 32 + 16 * static_cast<size_t>(j / 4) + 8 * static_cast<size_t>(h) + 2 * static_cast<size_t>(j % 4);
  }
  static constexpr size_t qs(int64_t j) { return 96 + 16 * static_cast<size_t>(j); }
};
static_assert(sizeof(BlockQ5_0) == 22 && Q5_0Column::qh(15, 1) + 2 == Q5_0Column::qs(0) &&
              Q5_0Column::qs(15) + 16 == Q5_0Column::kBytes);

// Byte offsets inside a Q4_K block column of a group (row j = 0..15; scale byte i = 0..11; chunk c = 0..3 and
// its piece t = 0..7: the row's quant bytes 32c + 4t .. + 3).
struct Q4KColumn {
  static constexpr size_t kBytes = 16 * 144;
  static constexpr size_t d(int64_t j) { return 2 * static_cast<size_t>(j); }
  static constexpr size_t dmin(int64_t j) { return 32 + 2 * static_cast<size_t>(j); }
  static constexpr size_t scale(int64_t j, int i) { return 64 + 16 * static_cast<size_t>(i) + static_cast<size_t>(j); }
  static constexpr size_t qs(int64_t j, int c, int t) {
    return 256 + 512 * static_cast<size_t>(c) + 64 * static_cast<size_t>(t) + 4 * static_cast<size_t>(j);
  }
};
static_assert(sizeof(BlockQ4_K) == 144 && Q4KColumn::scale(15, 11) + 1 == Q4KColumn::qs(0, 0, 0) &&
              Q4KColumn::qs(15, 3, 7) + 4 == Q4KColumn::kBytes);

// Byte offsets inside a Q5_K block column of a group (row j = 0..15, chunk c = 0..3).
struct Q5KColumn {
  static constexpr size_t kBytes = 16 * 176;
  static constexpr size_t d(int64_t j) { return 2 * static_cast<size_t>(j); }
  static constexpr size_t dmin(int64_t j) { return 32 + 2 * static_cast<size_t>(j); }
  static constexpr size_t scales(int64_t j) { return 64 + 12 * static_cast<size_t>(j); }
  static constexpr size_t qh(int64_t j) { return 256 + 320 * static_cast<size_t>(j / 2) + 32 * static_cast<size_t>(j % 2); }
  static constexpr size_t qs(int64_t j, int c) { return qh(j) + 64 + 64 * static_cast<size_t>(c); }
};
static_assert(sizeof(BlockQ5_K) == 176 && Q5KColumn::qs(15, 3) + 32 == Q5KColumn::kBytes);

// Byte offsets inside a Q6_K block column of a group (row j = 0..15; chunk k = 0..3 of ql, 4..5 of qh).
struct Q6KColumn {
  static constexpr size_t kBytes = 16 * 210;
  static constexpr size_t d(int64_t j) { return 2 * static_cast<size_t>(j); }
  static constexpr size_t scales(int64_t j) { return 32 + 16 * static_cast<size_t>(j); }
  static constexpr size_t chunk(int64_t j, int k) {
    return 288 + 384 * static_cast<size_t>(j / 2) + 64 * static_cast<size_t>(k) + 32 * static_cast<size_t>(j % 2);
  }
};
static_assert(sizeof(BlockQ6_K) == 210 && Q6KColumn::chunk(15, 5) + 32 == Q6KColumn::kBytes);

// Whether blocks of `type` have an interleaved form (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K).
bool interleavable(DType type);
// Whether a rows x cols matrix of `type` may be stored as `layout` (kRows: always; kInterleaved16: an
// interleavable type and a row count that is a positive multiple of 16).
bool layout_fits(WeightLayout layout, DType type, int64_t rows, int64_t cols);

// Converts `groups` consecutive 16-row groups between the two layouts (cols elements per row, a multiple of
// the block size). src and dst must not overlap.
void interleave_groups(DType type, int64_t cols, int64_t groups, const uint8_t* src, uint8_t* dst);
void deinterleave_groups(DType type, int64_t cols, int64_t groups, const uint8_t* src, uint8_t* dst);

// Row r (0 <= r < rows) of a matrix stored as `layout` at `data`, written in the row layout to `dst`
// (dtype_row_bytes(type, cols) bytes).
void copy_row(DType type, WeightLayout layout, int64_t cols, const uint8_t* data, int64_t r, uint8_t* dst);

// Hands the rows x cols matrix at `data` (stored as `layout`) to `sink` in the row layout, in order, as
// (byte offset, pointer, bytes) pieces: the matrix itself where it is in the row layout, else a few MiB at
// a time through a buffer (what a GPU worker uploads). Stops at, and returns, the first false from sink.
bool for_each_row_layout_piece(DType type, WeightLayout layout, int64_t rows, int64_t cols, const uint8_t* data,
                               const std::function<bool(size_t offset, const uint8_t* bytes, size_t n)>& sink);

}  // namespace inferd
