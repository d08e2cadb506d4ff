// The exact matmul (ops.h: the CPU engine's arithmetic) of every weight type, with helpers.cl's
// exact_helpers and weights.cl's loaders (workers/opencl/ops.cpp assembles the variants).
// Only the marked sections are embedded (format: inferd/kernels/opencl_sources.h); notes outside them are not.
//
// A work-item computes output slice so (4 rows) for TT tokens; the launch is (S_O, ceil(T / TT)),
// tokens past T read the last token (in bounds) and are not written.
//
// 32-element block types (Q8_0, Q4_0, Q5_0 against Q8_0; Q4_1, Q5_1 against Q8_1), kX86
// (dot_signed_q8_0, dot_unsigned_q8_1): per row 8 lanes; lane l of block b adds
// fma(d_w * d_a, isum, acc) where isum, the integer dot of the block's elements 4l..4l+3 (slice l;
// weights as signed values, or as codes for the types with a min), is computed by dot() in float:
// every product and partial sum is an integer below 2^24, so any order gives it exactly. Then hsum,
// and for Q4_1 / Q5_1 the min chain fma(m_w, s_a, acc_min) added last.
// The same, kScalar (scalar dot_x_q8_0 / dot_x_q8_1): sum += (d_w * d_a) * isum (+ m_w * s_a) per block.
// Q4_0 in the repacked matmul order (either CPU order): sum = fma(d_w * d_a, isum, sum) per block.
// F32 / F16 / BF16: the float input, as dot_float (kX86) or dot_float_weights (kScalar).
// K-quants: the k.* sections below.

// The first helper line of both exact matmuls: @tt@ tokens per work-item.
//@ define_tt
#define TT @tt@  // tokens per work-item
//@ end

// The int8 form of the block types' integer dots (IntDot::kInt8), with weights.cl's w_int8.<type>:
// inferd_idot() is cl_khr_integer_dot_product's dot(char4, char4) where the host saw the device
// report 4x8-bit inputs (INFERD_NATIVE_IDOT, defined by int_dot.native before these helpers; the
// extension alone may offer only the packed form), else the same sum in int arithmetic.
//@ int_dot.native
#define INFERD_NATIVE_IDOT 1
//@ end

//@ int_dot.helpers
#ifdef INFERD_NATIVE_IDOT
#pragma OPENCL EXTENSION cl_khr_integer_dot_product : enable
inline int inferd_idot(char4 a, char4 b) { return dot(a, b); }
#else
inline int inferd_idot(char4 a, char4 b) {
  const int4 p = convert_int4(a) * convert_int4(b);
  return (p.x + p.y) + (p.z + p.w);
}
#endif
// The 4 nibbles of v, lowest first, as char4.
inline char4 inferd_nibbles_c(ushort v) {
  const uint u = v;
  return convert_char4((uint4)(u & 15u, (u >> 4) & 15u, (u >> 8) & 15u, u >> 12));
}
//@ end

// The block types' slice dot, as the bodies spell it: WVEC r[4]; W_SLICE(wq, blk, l, r);
// XVEC xv = X_SLICE(quants); IDOT(r[i], xv) is the float of the integer dot.
//@ int_dot.int8
#define WVEC char4
#define XVEC char4
#define W_SLICE(wq, blk, l, r) w_int8(wq, wh, blk, l, r)
#define X_SLICE(v) convert_char4(v)
#define IDOT(w, x) ((float)inferd_idot(w, x))
//@ end

//@ int_dot.float
#define WVEC float4
#define XVEC float4
#define W_SLICE(wq, blk, l, r) w_int(wq, wh, blk, l, r)
#define X_SLICE(v) (v)
#define IDOT(w, x) dot(w, x)
//@ end

// Every body (also the K-quants') starts with head.
//@ head
  const int so = get_global_id(0);
  const int t0 = get_global_id(1) * TT;
  const int n_t = $x.Width();
  int tt[TT];
  for (int i = 0; i < TT; ++i) tt[i] = min(t0 + i, n_t - 1);
//@ end

// Block types, kX86: q8_x86, q8_x86.min_chain (types with a min), q8_x86.hsum, then
// q8_x86.write_with_min or q8_x86.write.
//@ q8_x86
  const int n_b = $x.Slices() / 8;
  float acc[TT][4][8];
  float4 acc_min[TT];
  for (int i = 0; i < TT; ++i) {
    acc_min[i] = (float4)(0.0f);
    for (int r = 0; r < 4; ++r) {
      for (int l = 0; l < 8; ++l) acc[i][r][l] = 0.0f;
    }
  }
  for (int b = 0; b < n_b; ++b) {
    const int blk = so * n_b + b;
    float4 sc[TT];
    for (int i = 0; i < TT; ++i) sc[i] = ws[blk] * xs[tt[i] * n_b + b].x;  // d_w * d_a, per row
    for (int l = 0; l < 8; ++l) {
      WVEC r[4];
      W_SLICE(wq, blk, l, r);
      for (int i = 0; i < TT; ++i) {
        const XVEC xv = X_SLICE($x.Read(tt[i], 0, 8 * b + l));
        acc[i][0][l] = fma(sc[i].x, IDOT(r[0], xv), acc[i][0][l]);
        acc[i][1][l] = fma(sc[i].y, IDOT(r[1], xv), acc[i][1][l]);
        acc[i][2][l] = fma(sc[i].z, IDOT(r[2], xv), acc[i][2][l]);
        acc[i][3][l] = fma(sc[i].w, IDOT(r[3], xv), acc[i][3][l]);
      }
    }
//@ end

//@ q8_x86.min_chain
    for (int i = 0; i < TT; ++i) acc_min[i] = fma(wm[blk], (float4)(xs[tt[i] * n_b + b].y), acc_min[i]);
//@ end

//@ q8_x86.hsum
  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) {
    float4 o;
    o.x = inferd_hsum8(vload4(0, acc[i][0]), vload4(1, acc[i][0]));
    o.y = inferd_hsum8(vload4(0, acc[i][1]), vload4(1, acc[i][1]));
    o.z = inferd_hsum8(vload4(0, acc[i][2]), vload4(1, acc[i][2]));
    o.w = inferd_hsum8(vload4(0, acc[i][3]), vload4(1, acc[i][3]));
//@ end

//@ q8_x86.write_with_min
    $y.Write(INFERD_OUT(o + acc_min[i], t0 + i, so), t0 + i, 0, so);
  }
//@ end

//@ q8_x86.write
    $y.Write(INFERD_OUT(o, t0 + i, so), t0 + i, 0, so);
  }
//@ end

// IQ4_NL, kX86, one token (IQ4NL::step, ggml's AVX2 vec_dot): as q8_x86, but even blocks accumulate
// into one set of 8 lanes and odd blocks into another, summed lane by lane before hsum; an unpaired last
// block (an odd count) is not accumulated: its integer total times d_w * d_a, rounded, is added to the
// hsum. (Two or more tokens go through the CPU's GEMM, whose single accumulator is q8_x86's order.)
// Then iq4nl_x86.write.
//@ iq4nl_x86
  const int n_b = $x.Slices() / 8;
  float acc[TT][4][8], acc2[TT][4][8];
  float4 tail[TT], tail_scale[TT];
  for (int i = 0; i < TT; ++i) {
    tail[i] = tail_scale[i] = (float4)(0.0f);
    for (int r = 0; r < 4; ++r) {
      for (int l = 0; l < 8; ++l) acc[i][r][l] = acc2[i][r][l] = 0.0f;
    }
  }
  for (int b = 0; b < n_b; ++b) {
    const int blk = so * n_b + b;
    const bool unpaired = (n_b & 1) != 0 && b == n_b - 1;
    float4 sc[TT];
    for (int i = 0; i < TT; ++i) sc[i] = ws[blk] * xs[tt[i] * n_b + b].x;  // d_w * d_a, per row
    for (int l = 0; l < 8; ++l) {
      WVEC r[4];
      W_SLICE(wq, blk, l, r);
      for (int i = 0; i < TT; ++i) {
        const XVEC xv = X_SLICE($x.Read(tt[i], 0, 8 * b + l));
        const float4 p = (float4)(IDOT(r[0], xv), IDOT(r[1], xv), IDOT(r[2], xv), IDOT(r[3], xv));
        if (unpaired) {
          tail[i] += p;  // integers: exact
        } else if ((b & 1) == 0) {
          acc[i][0][l] = fma(sc[i].x, p.x, acc[i][0][l]);
          acc[i][1][l] = fma(sc[i].y, p.y, acc[i][1][l]);
          acc[i][2][l] = fma(sc[i].z, p.z, acc[i][2][l]);
          acc[i][3][l] = fma(sc[i].w, p.w, acc[i][3][l]);
        } else {
          acc2[i][0][l] = fma(sc[i].x, p.x, acc2[i][0][l]);
          acc2[i][1][l] = fma(sc[i].y, p.y, acc2[i][1][l]);
          acc2[i][2][l] = fma(sc[i].z, p.z, acc2[i][2][l]);
          acc2[i][3][l] = fma(sc[i].w, p.w, acc2[i][3][l]);
        }
      }
    }
    if (unpaired) {
      for (int i = 0; i < TT; ++i) tail_scale[i] = sc[i];
    }
  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) {
    float4 o;
    o.x = inferd_hsum8(vload4(0, acc[i][0]) + vload4(0, acc2[i][0]), vload4(1, acc[i][0]) + vload4(1, acc2[i][0]));
    o.y = inferd_hsum8(vload4(0, acc[i][1]) + vload4(0, acc2[i][1]), vload4(1, acc[i][1]) + vload4(1, acc2[i][1]));
    o.z = inferd_hsum8(vload4(0, acc[i][2]) + vload4(0, acc2[i][2]), vload4(1, acc[i][2]) + vload4(1, acc2[i][2]));
    o.w = inferd_hsum8(vload4(0, acc[i][3]) + vload4(0, acc2[i][3]), vload4(1, acc[i][3]) + vload4(1, acc2[i][3]));
    if ((n_b & 1) != 0) o = o + tail[i] * tail_scale[i];  // FP_CONTRACT OFF: the product rounds first
    $y.Write(INFERD_OUT(o, t0 + i, so), t0 + i, 0, so);
  }
//@ end

// Block types, kScalar: q8_scalar, q8_scalar.sum_with_min or q8_scalar.sum, then q8_scalar.write.
//@ q8_scalar
  const int n_b = $x.Slices() / 8;
  float4 sum[TT];
  for (int i = 0; i < TT; ++i) sum[i] = (float4)(0.0f);
  for (int b = 0; b < n_b; ++b) {
    const int blk = so * n_b + b;
    float4 isum[TT];
    for (int i = 0; i < TT; ++i) isum[i] = (float4)(0.0f);
    for (int l = 0; l < 8; ++l) {
      WVEC r[4];
      W_SLICE(wq, blk, l, r);
      for (int i = 0; i < TT; ++i) {
        const XVEC xv = X_SLICE($x.Read(tt[i], 0, 8 * b + l));
        isum[i] += (float4)(IDOT(r[0], xv), IDOT(r[1], xv), IDOT(r[2], xv), IDOT(r[3], xv));  // integers: exact
      }
    }
    for (int i = 0; i < TT; ++i) {
      const float2 a = xs[tt[i] * n_b + b];
//@ end

//@ q8_scalar.sum_with_min
      sum[i] = sum[i] + (ws[blk] * a.x * isum[i] + wm[blk] * a.y);
//@ end

//@ q8_scalar.sum
      sum[i] = sum[i] + ws[blk] * a.x * isum[i];
//@ end

// MatmulOrder::kRepacked (inferd/kernels/cpu.h; Q4_0 and IQ4_NL): the block's exact integer dot, then one fma
// with d_w * d_a per block (llama.cpp's repacked q4_0_8x8 and iq4_nl_8x8 kernels), after q8_scalar, before
// q8_scalar.write.
//@ q8_repacked.sum
      sum[i] = fma(ws[blk] * a.x, isum[i], sum[i]);
//@ end

//@ q8_scalar.write
    }
  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) $y.Write(INFERD_OUT(sum[i], t0 + i, so), t0 + i, 0, so);
//@ end

// Float weights, kX86 (dot_float): acc0 = (a0, a1) and acc1 = (a2, a3), 8 lanes each, over steps of
// 16 elements.
//@ float_x86
  const int k = $x.Channels();
  const int n_si = $x.Slices();
  float4 a0[TT][4], a1[TT][4], a2[TT][4], a3[TT][4];
  for (int i = 0; i < TT; ++i) {
    for (int r = 0; r < 4; ++r) a0[i][r] = a1[i][r] = a2[i][r] = a3[i][r] = (float4)(0.0f);
  }
  int e = 0;
  for (; e + 16 <= k; e += 16) {
    const int s = e / 4;
    float4 w0[4], w1[4], w2[4], w3[4];
    w_load(wq, ws, wm, wsub, wh, so, s, n_si, w0);
    w_load(wq, ws, wm, wsub, wh, so, s + 1, n_si, w1);
    w_load(wq, ws, wm, wsub, wh, so, s + 2, n_si, w2);
    w_load(wq, ws, wm, wsub, wh, so, s + 3, n_si, w3);
    for (int i = 0; i < TT; ++i) {
      const float4 x0 = $x.Read(tt[i], 0, s), x1 = $x.Read(tt[i], 0, s + 1);
      const float4 x2 = $x.Read(tt[i], 0, s + 2), x3 = $x.Read(tt[i], 0, s + 3);
      for (int r = 0; r < 4; ++r) {
        a0[i][r] = fma(w0[r], x0, a0[i][r]);
        a1[i][r] = fma(w1[r], x1, a1[i][r]);
        a2[i][r] = fma(w2[r], x2, a2[i][r]);
        a3[i][r] = fma(w3[r], x3, a3[i][r]);
      }
    }
  }
  if (e + 8 <= k) {
    const int s = e / 4;
    float4 w0[4], w1[4];
    w_load(wq, ws, wm, wsub, wh, so, s, n_si, w0);
    w_load(wq, ws, wm, wsub, wh, so, s + 1, n_si, w1);
    for (int i = 0; i < TT; ++i) {
      const float4 x0 = $x.Read(tt[i], 0, s), x1 = $x.Read(tt[i], 0, s + 1);
      for (int r = 0; r < 4; ++r) {
        a0[i][r] = fma(w0[r], x0, a0[i][r]);
        a1[i][r] = fma(w1[r], x1, a1[i][r]);
      }
    }
    e += 8;
  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) {
    float o[4];
    for (int r = 0; r < 4; ++r) o[r] = inferd_hsum8(a0[i][r] + a2[i][r], a1[i][r] + a3[i][r]);
    for (int f = e; f < k; ++f) {  // the last k % 8 products, one fma each (GCC contracts the tail)
      float4 w[4];
      w_load(wq, ws, wm, wsub, wh, so, f / 4, n_si, w);
      const float xf = inferd_lane($x.Read(tt[i], 0, f / 4), f % 4);
      for (int r = 0; r < 4; ++r) o[r] = fma(inferd_lane(w[r], f % 4), xf, o[r]);
    }
    $y.Write(INFERD_OUT((float4)(o[0], o[1], o[2], o[3]), t0 + i, so), t0 + i, 0, so);
  }
//@ end

// Float weights, kScalar (dot_float_weights).
//@ float_scalar
  const int k = $x.Channels();
  const int n_si = $x.Slices();
  float4 sum[TT];
  for (int i = 0; i < TT; ++i) sum[i] = (float4)(0.0f);
  for (int s = 0; s < n_si; ++s) {
    float4 w[4];
    w_load(wq, ws, wm, wsub, wh, so, s, n_si, w);
    const int n = min(4, k - 4 * s);
    for (int i = 0; i < TT; ++i) {
      const float4 xv = $x.Read(tt[i], 0, s);
      for (int c = 0; c < n; ++c) {
        const float4 column = (float4)(inferd_lane(w[0], c), inferd_lane(w[1], c), inferd_lane(w[2], c),
                                       inferd_lane(w[3], c));
        sum[i] = sum[i] + column * inferd_lane(xv, c);
      }
    }
  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) $y.Write(INFERD_OUT(sum[i], t0 + i, so), t0 + i, 0, so);
//@ end

// ---- K-quants ----
// The exact matmul of K-quant weights against quantize_q8_k()'s blocks (`xk`: d_a and the 16 sums
// bsum_g of 16 quants a), per 256-element super-block of a row, the integers exact (int):
//   sumi_l = sum over the 8 groups s of 32 of sc(s, l) * sum_{e = 4l..4l+3} q[32s + e] * a[32s + e],
//            l = 0..7, with the unsigned codes q (Q6_K: value + 32) and sc(s, l) = sc_s for Q4_K / Q5_K,
//            the scale of the 16 elements that hold them for Q6_K (scales[2s + l / 4]);
//   p_j    = mn_2j * (bsum_4j + bsum_4j+1) + mn_2j+1 * (bsum_4j+2 + bsum_4j+3), j = 0..3 (Q4_K, Q5_K);
//   off_l  = 32 * (sc_2l * bsum_2l + sc_2l+1 * bsum_2l+1) (Q6_K: the -32 of the values).
// kX86 (x86_kernels.inc), per super-block:
//   Q4_K / Q5_K (dot_k_min, k_min_float_step): acc_l = fma(d_a * d, (float)sumi_l, acc_l); with
//     neg = -(d_a * dmin), Q4_K accm_j = fma(neg, (float)p_j, accm_j), Q5_K summs = fma(neg,
//     (float)(p_0 + p_1 + p_2 + p_3), summs); at the end (k_min_result) y = hsum(acc) +
//     ((accm_0 + accm_2) + (accm_1 + accm_3)), resp. y = hsum(acc) + summs.
//   Q6_K (dot_q6_k_nr, q6_k_float_step): acc_l = fma(d * d_a, (float)(sumi_l - off_l), acc_l); y = hsum(acc).
// kScalar (scalar.cpp dot_kq_min, dot_q6_k), with isum = sum_l sumi_l:
//   Q4_K / Q5_K: y = y + d_a * (d * (float)isum - dmin * (float)(p_0 + p_1 + p_2 + p_3))
//   Q6_K:        y = y + (d * d_a) * (float)(isum - sum_l off_l)
// (float)n of an int rounds to nearest even in both: Q6_K's totals may pass 2^24.
//
// Helpers: define_tt, quantize.cl's define_q8k_floats, exact_helpers, weights.cl's codes and
// w_code.<type>, then k.helpers. Body: head, k.sums, k.scale_q6 or k.scale, k.dots, k.dmin (not Q6_K),
// k.rows (Q4_K repacked: k.dots_repacked for k.dots); Q6_K: k.q6_offsets (Q3_K, IQ4_XS: k.no_offsets), then
// k.q6_x86 or k.q6_scalar; Q2_K: k.q2_x86 or k.q2_scalar; Q4_K / Q5_K: k.mins, then k.mins_scalar, or k.mins_x86,
// k.mins_x86_q4_k or k.mins_x86_q5_k, k.acc_x86, or (Q4_K repacked) k.mins_repacked; then k.out, one of
// k.out_scalar, k.out_q6, k.out_q4_k, k.out_q5_k (kX86), k.out_repacked, and k.write. In the repacked order the
// other types' vec_dot steps and output go into the else branch of `if (n_t >= TILED_MIN_ROWS)`, whose first branch
// takes k.tiled, k.tiled_q2 or k.tiled_mins and k.out_scalar (ops.cpp, matmul_exact_k_template).
// Sub-block scale entries per super-block in wsub: 32 for Q2_K (its 16 scales and 16 mins), else 16.
//@ k.subs
#define SUBS @subs@
//@ end

//@ k.helpers
inline int inferd_idot(int4 a, int4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
inline int inferd_ilane(int4 v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }
//@ end

//@ k.sums
  const int n_b = $x.Slices() / 64;  // super-blocks per row
  float acc[TT][4][8];   // kX86: the 8 lanes per row
  float accm[TT][4][4];  // kX86 Q4_K: the min lanes
  float sum[TT][4];      // kX86 Q5_K: the min chain; kScalar: the row's sum
  for (int i = 0; i < TT; ++i) {
    for (int r = 0; r < 4; ++r) {
      sum[i][r] = 0.0f;
      for (int l = 0; l < 8; ++l) acc[i][r][l] = 0.0f;
      for (int j = 0; j < 4; ++j) accm[i][r][j] = 0.0f;
    }
  }
  for (int b = 0; b < n_b; ++b) {
    const int blk = so * n_b + b;
    int sumi[TT][4][8];
    for (int i = 0; i < TT; ++i) {
      for (int r = 0; r < 4; ++r) {
        for (int l = 0; l < 8; ++l) sumi[i][r][l] = 0;
      }
    }
    for (int s = 0; s < 8; ++s) {
      for (int l = 0; l < 8; ++l) {
        int4 w[4];
        w_code(wq, wh, blk * 8 + s, l, w);
//@ end

//@ k.scale_q6
        const int4 sc = convert_int4(wsub[blk * SUBS + 2 * s + l / 4]);
//@ end

//@ k.scale
        const int4 sc = convert_int4(wsub[blk * SUBS + s]);
//@ end

//@ k.dots
        for (int i = 0; i < TT; ++i) {
          const int4 a = convert_int4($x.Read(tt[i], 0, 64 * b + 8 * s + l));
          sumi[i][0][l] += sc.x * inferd_idot(w[0], a);
          sumi[i][1][l] += sc.y * inferd_idot(w[1], a);
          sumi[i][2][l] += sc.z * inferd_idot(w[2], a);
          sumi[i][3][l] += sc.w * inferd_idot(w[3], a);
        }
      }
    }
    int4 ssc[SUBS];  // Q4_K / Q5_K: sc_0..7, mn_0..7; Q6_K: the 16 scales; Q2_K: the 16 scales, the 16 mins
    for (int g = 0; g < SUBS; ++g) ssc[g] = convert_int4(wsub[blk * SUBS + g]);
    const float4 d = ws[blk];
//@ end

// Q4_K in the repacked order: the sums per pair of sub-blocks j = s / 2 (sumi[i][r][j], j = 0..3) instead of
// per lane.
//@ k.dots_repacked
        for (int i = 0; i < TT; ++i) {
          const int4 a = convert_int4($x.Read(tt[i], 0, 64 * b + 8 * s + l));
          sumi[i][0][s / 2] += sc.x * inferd_idot(w[0], a);
          sumi[i][1][s / 2] += sc.y * inferd_idot(w[1], a);
          sumi[i][2][s / 2] += sc.z * inferd_idot(w[2], a);
          sumi[i][3][s / 2] += sc.w * inferd_idot(w[3], a);
        }
      }
    }
    int4 ssc[SUBS];  // Q4_K / Q5_K: sc_0..7, mn_0..7; Q6_K: the 16 scales; Q2_K: the 16 scales, the 16 mins
    for (int g = 0; g < SUBS; ++g) ssc[g] = convert_int4(wsub[blk * SUBS + g]);
    const float4 d = ws[blk];
//@ end

//@ k.dmin
    const float4 dmin = wm[blk];
//@ end

//@ k.rows
    for (int i = 0; i < TT; ++i) {
      __global const float* xb = xk + (tt[i] * n_b + b) * Q8K_FLOATS;
      const float da = xb[0];
      int bs[16];
      for (int g = 0; g < 16; ++g) bs[g] = (int)xb[1 + g];
      for (int r = 0; r < 4; ++r) {
        const float dr = inferd_lane(d, r);
//@ end

//@ k.q6_offsets
        int off[8];
        for (int l = 0; l < 8; ++l) {
          off[l] = 32 * (inferd_ilane(ssc[2 * l], r) * bs[2 * l] + inferd_ilane(ssc[2 * l + 1], r) * bs[2 * l + 1]);
        }
//@ end

//@ k.q6_x86
        const float scale = dr * da;
        for (int l = 0; l < 8; ++l) acc[i][r][l] = fma(scale, (float)(sumi[i][r][l] - off[l]), acc[i][r][l]);
//@ end

//@ k.q6_scalar
        int isum = 0;
        for (int l = 0; l < 8; ++l) isum += sumi[i][r][l] - off[l];
        sum[i][r] = sum[i][r] + (dr * da) * (float)isum;
//@ end

// MatmulOrder::kRepacked for Q2_K, Q3_K, Q5_K, Q6_K and IQ4_XS (inferd/kernels/gemm.h kTiledMinRows): from that
// many tokens on, llama.cpp's tiled K-quant GEMM; ops.cpp puts one of these under `if (n_t >= TILED_MIN_ROWS)`, the
// vec_dot order's steps in the else branch, and writes k.out_scalar in the first case.
// Q3_K, Q6_K, IQ4_XS (after k.q6_offsets or k.no_offsets): sum = fma((float)total * d, d_a, sum) with
// total = sum_l (sumi_l - off_l).
//@ k.tiled
        int total = 0;
        for (int l = 0; l < 8; ++l) total += sumi[i][r][l] - off[l];
        sum[i][r] = fma((float)total * dr, da, sum[i][r]);
//@ end

// Q2_K: n = sum_l sumi_l, m = sum_g mn_g * bsum_g, sum = fma(fma(-dmin, (float)m, d * (float)n), d_a, sum).
//@ k.tiled_q2
        int isum = 0, msum = 0;
        for (int l = 0; l < 8; ++l) isum += sumi[i][r][l];
        for (int g = 0; g < 16; ++g) msum += inferd_ilane(ssc[16 + g], r) * bs[g];
        sum[i][r] = fma(fma(-inferd_lane(dmin, r), (float)msum, dr * (float)isum), da, sum[i][r]);
//@ end

// Q5_K (after k.mins): as Q2_K with m = p_0 + p_1 + p_2 + p_3.
//@ k.tiled_mins
        int isum = 0;
        for (int l = 0; l < 8; ++l) isum += sumi[i][r][l];
        const int msum = p[0] + p[1] + p[2] + p[3];
        sum[i][r] = fma(fma(-inferd_lane(dmin, r), (float)msum, dr * (float)isum), da, sum[i][r]);
//@ end

// Q3_K and IQ4_XS: signed values and scales, no offset; then k.q6_x86 or k.q6_scalar as Q6_K (ggml's
// Q3_K and IQ4_XS kernels: acc_l = fma(d_a * d, (float)sumi_l, acc_l); scalar dot_kq_scaled).
//@ k.no_offsets
        int off[8];
        for (int l = 0; l < 8; ++l) off[l] = 0;
//@ end

// Q2_K (Q2K::step, kX86): per super-block the min lanes first, into the same 8 lanes,
//   acc_l = fma(-(d_a * dmin), (float)(mn_2l * bsum_2l + mn_2l+1 * bsum_2l+1), acc_l),
// then acc_l = fma(d_a * d, (float)sumi_l, acc_l); y = hsum(acc) (k.out_q6).
//@ k.q2_x86
        const float neg = -(da * inferd_lane(dmin, r));
        for (int l = 0; l < 8; ++l) {
          const int pm = inferd_ilane(ssc[16 + 2 * l], r) * bs[2 * l] + inferd_ilane(ssc[17 + 2 * l], r) * bs[2 * l + 1];
          acc[i][r][l] = fma(neg, (float)pm, acc[i][r][l]);
        }
        const float scale = da * dr;
        for (int l = 0; l < 8; ++l) acc[i][r][l] = fma(scale, (float)sumi[i][r][l], acc[i][r][l]);
//@ end

// Q2_K, kScalar (dot_q2_k): y = y + d_a * (d * (float)isum - dmin * (float)sum_g mn_g * bsum_g).
//@ k.q2_scalar
        int isum = 0, msum = 0;
        for (int l = 0; l < 8; ++l) isum += sumi[i][r][l];
        for (int g = 0; g < 16; ++g) msum += inferd_ilane(ssc[16 + g], r) * bs[g];
        sum[i][r] = sum[i][r] + da * (dr * (float)isum - inferd_lane(dmin, r) * (float)msum);
//@ end

//@ k.mins
        int p[4];
        for (int j = 0; j < 4; ++j) {
          p[j] = inferd_ilane(ssc[8 + 2 * j], r) * (bs[4 * j] + bs[4 * j + 1]) +
                 inferd_ilane(ssc[9 + 2 * j], r) * (bs[4 * j + 2] + bs[4 * j + 3]);
        }
//@ end

// MatmulOrder::kRepacked (inferd/kernels/cpu.h; Q4_K, either CPU order; after k.dots_repacked and k.mins):
// llama.cpp's repacked q4_K_8x8 orders. Its GEMM's for the tokens before n_t - n_t % 4, per pair j of sub-blocks
// sum = fma((float)sumi_j, d * d_a, sum) and accm_0 = fma((float)p_j, dmin * d_a, accm_0); its GEMV's for the
// rest, the same once per super-block with n = sum_j sumi_j and m = sum_j p_j; y = sum - accm_0 (k.out_repacked).
//@ k.mins_repacked
        if (tt[i] < n_t - n_t % 4) {
          for (int j = 0; j < 4; ++j) {
            sum[i][r] = fma((float)sumi[i][r][j], dr * da, sum[i][r]);
            accm[i][r][0] = fma((float)p[j], inferd_lane(dmin, r) * da, accm[i][r][0]);
          }
        } else {
          const int isum = sumi[i][r][0] + sumi[i][r][1] + sumi[i][r][2] + sumi[i][r][3];
          sum[i][r] = fma((float)isum, dr * da, sum[i][r]);
          accm[i][r][0] = fma((float)(p[0] + p[1] + p[2] + p[3]), inferd_lane(dmin, r) * da, accm[i][r][0]);
        }
//@ end

//@ k.mins_scalar
        int isum = 0;
        for (int l = 0; l < 8; ++l) isum += sumi[i][r][l];
        const float msum = (float)(p[0] + p[1] + p[2] + p[3]);
        sum[i][r] = sum[i][r] + da * (dr * (float)isum - inferd_lane(dmin, r) * msum);
//@ end

//@ k.mins_x86
        const float neg = -(da * inferd_lane(dmin, r));
//@ end

//@ k.mins_x86_q4_k
        for (int j = 0; j < 4; ++j) accm[i][r][j] = fma(neg, (float)p[j], accm[i][r][j]);
//@ end

//@ k.mins_x86_q5_k
        sum[i][r] = fma(neg, (float)(p[0] + p[1] + p[2] + p[3]), sum[i][r]);
//@ end

//@ k.acc_x86
        const float scale = da * dr;
        for (int l = 0; l < 8; ++l) acc[i][r][l] = fma(scale, (float)sumi[i][r][l], acc[i][r][l]);
//@ end

//@ k.out
      }
    }
  }
  for (int i = 0; i < TT && t0 + i < n_t; ++i) {
    float o[4];
    for (int r = 0; r < 4; ++r) {
//@ end

//@ k.out_scalar
      o[r] = sum[i][r];
//@ end

//@ k.out_repacked
      o[r] = sum[i][r] - accm[i][r][0];
//@ end

//@ k.out_q6
      o[r] = inferd_hsum8(vload4(0, acc[i][r]), vload4(1, acc[i][r]));
//@ end

//@ k.out_q4_k
      o[r] = inferd_hsum8(vload4(0, acc[i][r]), vload4(1, acc[i][r])) +
             ((accm[i][r][0] + accm[i][r][2]) + (accm[i][r][1] + accm[i][r][3]));
//@ end

//@ k.out_q5_k
      o[r] = inferd_hsum8(vload4(0, acc[i][r]), vload4(1, acc[i][r])) + sum[i][r];
//@ end

//@ k.write
    }
    $y.Write(INFERD_OUT((float4)(o[0], o[1], o[2], o[3]), t0 + i, so), t0 + i, 0, so);
  }
//@ end
