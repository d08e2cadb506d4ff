#include "matmul.h"

#include <algorithm>
#include <vector>

#include "inferd/kernels/cpu.h"
#include "inferd/kernels/gemm.h"
#include "inferd/status.h"
#include "inferd/cpu_ops.h"

namespace inferd::cpu {

const DType kActTypes[kActKinds] = {DType::kF32, DType::kQ8_0, DType::kQ8_1, DType::kQ8_K};

int act_index(DType t) {
  switch (t) {
    case DType::kF32: return 0;
    case DType::kQ8_0: return 1;
    case DType::kQ8_1: return 2;
    case DType::kQ8_K: return 3;
    default: INFERD_ASSERT(false, "unexpected activation type %s", dtype_name(t)); return 0;
  }
}

DType act_type_of(DType weight_type) {
  const kernels::TypeKernels* tk = kernels::type_kernels(weight_type);
  INFERD_ASSERT(tk != nullptr, "no CPU kernels for %s", dtype_name(weight_type));
  return tk->act_type;
}

void encode_row(int kind, const float* src, uint8_t* dst, int64_t k) {
  // A kernel table whose act_type is kind `kind` (used for quantize_act only).
  static const DType kWeightFor[kActKinds] = {DType::kF32, DType::kQ8_0, DType::kQ4_1, DType::kQ4_K};
  static const kernels::TypeKernels* const kQuantizers[kActKinds] = {
      kernels::type_kernels(kWeightFor[0]), kernels::type_kernels(kWeightFor[1]), kernels::type_kernels(kWeightFor[2]),
      kernels::type_kernels(kWeightFor[3])};
  kQuantizers[kind]->quantize_act(src, dst, k);
}

namespace {
// w's GEMM in its matmul order, for its weights arranged as `layout`.
kernels::GemmFn gemm_in(const WeightView& w, WeightLayout layout) {
  return kernels::gemm_kernel_for(w.type, layout, kernels::best_isa(), kernels::matmul_order_for(w.type, w.rows));
}
}  // namespace

const kernels::TypeKernels* matmul_kernels(const WeightView& w) {
  return kernels::type_kernels(w.type, kernels::best_isa(), kernels::matmul_order_for(w.type, w.rows));
}
kernels::GemmFn matmul_gemm(const WeightView& w) { return gemm_in(w, w.layout); }
bool has_gemm(const WeightView& w) { return gemm_in(w, WeightLayout::kRows) != nullptr; }

namespace {

// Rows [r, r + n) of `w` as a matrix of n rows in the row layout: the rows themselves, or for an
// interleaved matrix a copy gathered into `buf`.
WeightView row_layout_rows(const WeightView& w, int64_t r, int64_t n, std::vector<uint8_t>& buf) {
  WeightView v = w;
  v.rows = n;
  if (!w.interleaved()) {
    v.data = w.row(r);
    return v;
  }
  buf.resize(static_cast<size_t>(n) * w.row_bytes);
  for (int64_t i = 0; i < n; ++i) copy_row(w.type, w.layout, w.cols, w.data, r + i, buf.data() + i * w.row_bytes);
  v.data = buf.data();
  v.layout = WeightLayout::kRows;
  return v;
}

// Interleaved weights on a path without a kernel for their layout (the scalar ISA, a type without an
// interleaved GEMM): 16 rows at a time gathered into the row layout and multiplied there (same bits).
void matmul_gathered(const MatmulJob& j, int64_t m, int max_nr, int64_t r0, int64_t r1) {
  thread_local std::vector<uint8_t> buf;
  for (int64_t rb = r0; rb < r1; rb += kInterleaveRows) {
    const int64_t n = std::min<int64_t>(kInterleaveRows, r1 - rb);
    const WeightView v = row_layout_rows(*j.w, rb, n, buf);
    MatmulJob part = j;
    part.w = &v;
    part.out = j.out + rb;
    part.bias = j.bias != nullptr ? j.bias + rb : nullptr;
    part.residual = j.residual != nullptr ? j.residual + rb : nullptr;
    matmul_rows(part, m, max_nr, 0, n);
  }
}

// out[i] = dot(row r + i, act) for i < 16 * n (r a group start, n <= kMaxX16Groups), in either layout: an
// interleaved matrix by its kernel where the ISA has one, else row by row (gathered rows for an interleaved matrix).
void group_dots(const WeightView& w, const kernels::TypeKernels* tk, int64_t r, int n, const uint8_t* act, float* out) {
  if (w.interleaved() && tk->dot_x16_groups != nullptr) {
    tk->dot_x16_groups(w.cols, w.row(r), kInterleaveRows * w.row_bytes, n, act, out);
    return;
  }
  if (w.interleaved() && tk->dot_x16 != nullptr) {
    for (int g = 0; g < n; ++g) tk->dot_x16(w.cols, w.row(r + g * kInterleaveRows), act, out + g * kInterleaveRows);
    return;
  }
  thread_local std::vector<uint8_t> buf;
  const WeightView v = row_layout_rows(w, r, n * kInterleaveRows, buf);
  for (int64_t i = 0; i < n * kInterleaveRows; ++i) tk->dot(w.cols, v.row(i), act, 0, 1, out + i);
}

// Groups per group_dots() call on the decode path: up to kMaxX16Groups, fewer where [r, r1) ends first.
int groups_from(int64_t r, int64_t r1) {
  return static_cast<int>(std::min<int64_t>(kernels::kMaxX16Groups, (r1 - r + kInterleaveRows - 1) / kInterleaveRows));
}

}  // namespace

void matmul_rows(const MatmulJob& j, int64_t m, int max_nr, int64_t r0, int64_t r1) {
  const bool interleaved = j.w->interleaved();
  INFERD_ASSERT(!interleaved || (r0 % kInterleaveRows == 0 && (r1 % kInterleaveRows == 0 || r1 == j.w->rows)),
                "interleaved rows are computed in whole groups");
  // A gathered part of an interleaved matrix has 16 rows: the same order as the matrix (whose row count is a
  // multiple of 16).
  const kernels::TypeKernels* tk = matmul_kernels(*j.w);
  const kernels::GemmFn gemm = max_nr > 1 ? matmul_gemm(*j.w) : nullptr;
  if (interleaved && (max_nr > 1 ? gemm == nullptr : tk->dot_x16 == nullptr)) {
    return matmul_gathered(j, m, max_nr, r0, r1);
  }
  if (j.residual != nullptr && j.residual != j.out) {
    INFERD_ASSERT(j.accumulate);
    for (int64_t t = 0; t < m; ++t) {
      std::copy(j.residual + t * j.out_stride + r0, j.residual + t * j.out_stride + r1, j.out + t * j.out_stride + r0);
    }
  }
  const int a = act_index(tk->act_type);
  // The GEMM path uses the register-tiled kernel where one exists (same bits as `dot`).
  if (max_nr > 1) {
    if (gemm != nullptr) {
      gemm({j.w->type, j.w->cols, j.w->data, j.w->row_bytes, r0, r1, j.act[a], j.act_row_bytes[a], m, j.out,
            j.out_stride, j.accumulate, j.bias, j.w->layout});
      return;
    }
  }
  const uint8_t* act = j.act[a];
  const size_t stride = j.act_row_bytes[a];
  const int64_t k = j.w->cols;
  auto store = [&](int64_t t, int64_t r, float v) {
    float* o = j.out + t * j.out_stride + r;
    *o = j.accumulate ? *o + v : v + (j.bias ? j.bias[r] : 0.0f);
  };
  // Decode on interleaved weights: a group of 16 rows per call, one sequential stream.
  if (interleaved) {
    INFERD_ASSERT(max_nr == 1);
    // No prefetch by hand: the chunk is one sequential stream, which the hardware prefetcher follows (a
    // 4 KiB warm-up here cost the 1.1B Q4_K_M decode 9%: BENCHMARKS.md, "No software prefetch ...").
    float y[kernels::kMaxX16Groups * kInterleaveRows];
    for (int64_t t = 0; t < m; ++t) {
      const uint8_t* at = act + static_cast<size_t>(t) * stride;
      for (int64_t r = r0; r < r1;) {
        const int n = groups_from(r, r1);
        group_dots(*j.w, tk, r, n, at, y);
        const int64_t end = std::min(r1, r + n * kInterleaveRows);
        for (int64_t i = r; i < end; ++i) store(t, i, y[i - r]);
        r = end;
      }
    }
    return;
  }
  // Decode: four weight rows at a time (four independent accumulation chains; same bits as `dot`).
  if (max_nr == 1 && tk->dot_w4 != nullptr) {
    // The kernels prefetch the rows two calls ahead as they stream; the first two calls of a chunk
    // have nobody to do that for them, so ask for those 8 rows at once here (one burst of misses in
    // parallel instead of a cold start, at every chunk of every matmul of every layer).
    const int64_t warm = std::min<int64_t>(r1, r0 + 8);
    for (int64_t r = r0; r < warm; ++r) {
      const char* row = reinterpret_cast<const char*>(j.w->row(r));
      for (size_t off = 0; off < j.w->row_bytes; off += 64) __builtin_prefetch(row + off, 0, 3);
    }
    float y4[4];
    for (int64_t t = 0; t < m; ++t) {
      const uint8_t* at = act + static_cast<size_t>(t) * stride;
      int64_t r = r0;
      for (; r + 4 <= r1; r += 4) {
        tk->dot_w4(k, j.w->row(r), j.w->row_bytes, at, y4);
        for (int i = 0; i < 4; ++i) store(t, r + i, y4[i]);
      }
      for (; r < r1; ++r) {
        tk->dot(k, j.w->row(r), at, stride, 1, y4);
        store(t, r, y4[0]);
      }
    }
    return;
  }
  const int64_t rb = max_nr == 1 ? r1 - r0
                                 : std::max<int64_t>(1, static_cast<int64_t>((32 * 1024) / std::max<size_t>(j.w->row_bytes, 1)));
  float y[kernels::kMaxDotRows];
  for (int64_t rb0 = r0; rb0 < r1; rb0 += rb) {
    const int64_t rb1 = std::min(r1, rb0 + rb);
    for (int64_t t0 = 0; t0 < m; t0 += max_nr) {
      const int nr = static_cast<int>(std::min<int64_t>(max_nr, m - t0));
      const uint8_t* a0 = act + static_cast<size_t>(t0) * stride;
      for (int64_t r = rb0; r < rb1; ++r) {
        tk->dot(k, j.w->row(r), a0, stride, nr, y);
        const float b = j.bias ? j.bias[r] : 0.0f;
        for (int i = 0; i < nr; ++i) {
          float* o = j.out + (t0 + i) * j.out_stride + r;
          *o = j.accumulate ? *o + y[i] : y[i] + b;
        }
      }
    }
  }
}

void gate_up_rows(const WeightView& wg, const WeightView& wu, uint8_t* const* act, const size_t* act_row_bytes,
                  float* h, int64_t m, int max_nr, int64_t n_ff, int64_t r0, int64_t r1, bool geglu) {
  auto act_fn = [geglu](float g) { return geglu ? kernels::gelu(g) : ops::silu(g); };
  const kernels::TypeKernels* tg = matmul_kernels(wg);
  const kernels::TypeKernels* tu = matmul_kernels(wu);
  const int ag = act_index(tg->act_type), au = act_index(tu->act_type);
  const int64_t k = wg.cols;
  const int64_t rb = max_nr == 1 ? r1 - r0
                                 : std::max<int64_t>(1, static_cast<int64_t>((32 * 1024) / (wg.row_bytes + wu.row_bytes)));
  float g[kernels::kMaxDotRows], u[kernels::kMaxDotRows];
  if (wg.interleaved() || wu.interleaved()) {
    INFERD_ASSERT(r0 % kInterleaveRows == 0 && r1 % kInterleaveRows == 0, "interleaved rows are computed in whole groups");
    if (max_nr > 1) {
      // Prefill without a GEMM for either type (the scalar ISA): gathered rows, 16 at a time, in the row layout.
      thread_local std::vector<uint8_t> gbuf, ubuf;
      for (int64_t g0 = r0; g0 < r1; g0 += kInterleaveRows) {
        const WeightView g16 = row_layout_rows(wg, g0, kInterleaveRows, gbuf);
        const WeightView u16 = row_layout_rows(wu, g0, kInterleaveRows, ubuf);
        gate_up_rows(g16, u16, act, act_row_bytes, h + g0, m, max_nr, n_ff, 0, kInterleaveRows, geglu);
      }
      return;
    }
    // Decode: up to kMaxX16Groups groups of 16 rows of gate, then of up, per step.
    float gy[kernels::kMaxX16Groups * kInterleaveRows], uy[kernels::kMaxX16Groups * kInterleaveRows];
    for (int64_t t = 0; t < m; ++t) {
      const uint8_t* ag_t = act[ag] + static_cast<size_t>(t) * act_row_bytes[ag];
      const uint8_t* au_t = act[au] + static_cast<size_t>(t) * act_row_bytes[au];
      for (int64_t r = r0; r < r1;) {
        const int n = groups_from(r, r1);
        group_dots(wg, tg, r, n, ag_t, gy);
        group_dots(wu, tu, r, n, au_t, uy);
        // The outputs at once, each exactly act_fn(g) * u (swiglu and geglu are elementwise and bit-identical
        // to silu / gelu per element).
        (geglu ? kernels::geglu : kernels::swiglu)(n * kInterleaveRows, gy, uy, h + t * n_ff + r);
        r += n * kInterleaveRows;
      }
    }
    return;
  }
  // Decode: four rows of gate and of up at a time (same bits as `dot`, see TypeKernels::dot_w4).
  if (max_nr == 1 && tg->dot_w4 != nullptr && tu->dot_w4 != nullptr) {
    for (int64_t t = 0; t < m; ++t) {
      const uint8_t* ag_t = act[ag] + static_cast<size_t>(t) * act_row_bytes[ag];
      const uint8_t* au_t = act[au] + static_cast<size_t>(t) * act_row_bytes[au];
      int64_t r = r0;
      for (; r + 4 <= r1; r += 4) {
        tg->dot_w4(k, wg.row(r), wg.row_bytes, ag_t, g);
        tu->dot_w4(k, wu.row(r), wu.row_bytes, au_t, u);
        for (int i = 0; i < 4; ++i) h[t * n_ff + r + i] = act_fn(g[i]) * u[i];
      }
      for (; r < r1; ++r) {
        tg->dot(k, wg.row(r), ag_t, act_row_bytes[ag], 1, g);
        tu->dot(k, wu.row(r), au_t, act_row_bytes[au], 1, u);
        h[t * n_ff + r] = act_fn(g[0]) * u[0];
      }
    }
    return;
  }
  for (int64_t rb0 = r0; rb0 < r1; rb0 += rb) {
    const int64_t rb1 = std::min(r1, rb0 + rb);
    for (int64_t t0 = 0; t0 < m; t0 += max_nr) {
      const int nr = static_cast<int>(std::min<int64_t>(max_nr, m - t0));
      for (int64_t r = rb0; r < rb1; ++r) {
        tg->dot(k, wg.row(r), act[ag] + static_cast<size_t>(t0) * act_row_bytes[ag], act_row_bytes[ag], nr, g);
        tu->dot(k, wu.row(r), act[au] + static_cast<size_t>(t0) * act_row_bytes[au], act_row_bytes[au], nr, u);
        for (int i = 0; i < nr; ++i) h[(t0 + i) * n_ff + r] = act_fn(g[i]) * u[i];
      }
    }
  }
}

}  // namespace inferd::cpu
