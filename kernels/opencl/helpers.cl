// Pieces shared by the kernels of several op families (workers/opencl/ops.cpp).
// Only the marked sections are embedded (format: inferd/kernels/opencl_sources.h); notes outside them are not.

// The (b, x, y) of this work-group's row, for row ops launched as (lanes, rows).
//@ row_prologue
  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int row = get_global_id(1);
  const int b = row % $src.Batch();
  const int x = (row / $src.Batch()) % $src.Width();
  const int y = row / ($src.Batch() * $src.Width());
  const int n_s = $src.Slices();
//@ end

// A tree reduction of `scratch[0 .. get_local_size(0))` into scratch[0] with @op@ (a binary
// function-like macro name or function). get_local_size(0) is a power of two; every lane must reach it.
//@ reduce
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int off = lsz / 2; off > 0; off >>= 1) {
    if (lid < off) scratch[lid] = @op@(scratch[lid], scratch[lid + off]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
//@ end

// Helpers of every exact kernel. The constants and the order of operations are those of
// kernels/cpu/ggml_math.h and x86_kernels.inc; each line says which function it mirrors.
//@ exact_helpers
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
// No contraction of a * b + c into one fma from here on: OpenCL C allows it by default (FP_CONTRACT ON),
// and a driver that does it (NVIDIA's) rounds differently from the host's separate multiply and add.
// The fma() calls written out are the host's own fused multiply-adds.
#pragma OPENCL FP_CONTRACT OFF
// Float division and square root correctly rounded, as the host's: the device's own where the program
// is built with -cl-fp32-correctly-rounded-divide-sqrt (INFERD_CR_DIVIDE_SQRT, where the device reports
// CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT), else through double, whose 53 bits make rounding twice give
// the correctly rounded float (OpenCL's default float ones may be off by ulps).
#ifdef INFERD_CR_DIVIDE_SQRT
inline float inferd_div(float a, float b) { return a / b; }
inline float inferd_sqrt(float a) { return sqrt(a); }
#else
inline float inferd_div(float a, float b) { return (float)((double)a / (double)b); }
inline float inferd_sqrt(float a) { return (float)sqrt((double)a); }
#endif
// v rounded to IEEE half to nearest even (vstore_half's mode; F16C's), and back.
inline float inferd_round_half(float v) {
  ushort h;
  vstore_half(v, 0, (half*)&h);
  return vload_half(0, (const half*)&h);
}
// exp(x) as one lane of ggml_v_expf (ggml_math::expf_lane).
inline float inferd_expf(float x) {
  const float z = fma(x, 0x1.715476p+0f, 0x1.8p23f);
  const float n = z - 0x1.8p23f;
  const float b = fma(-n, 0x1.7f7d1cp-20f, fma(-n, 0x1.62e4p-1f, x));
  if (fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
  const float u = b * b;
  const float j = fma(fma(fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                      fma(0x1.ffffecp-1f, b, 1.0f));
  return ldexp(j, (int)n);
}
// x * sigmoid(x) as ggml_v_silu (ggml_math::silu_lane).
inline float inferd_silu1(float x) { return inferd_div(x, 1.0f + inferd_expf(0.0f - x)); }
inline float4 inferd_silu4(float4 x) {
  return (float4)(inferd_silu1(x.x), inferd_silu1(x.y), inferd_silu1(x.z), inferd_silu1(x.w));
}
// The horizontal sum of 8 float lanes (lo: lanes 0..3, hi: 4..7) in x86_kernels.inc's hsum order.
inline float inferd_hsum8(float4 lo, float4 hi) {
  const float4 s = lo + hi;
  return (s.x + s.z) + (s.y + s.w);
}
// The sum of 16 lanes in _mm512_reduce_add_ps's order (ggml_math::reduce16).
inline float inferd_reduce16(float16 v) {
  const float8 a = v.hi + v.lo;
  const float4 b = a.hi + a.lo;
  return (b.x + b.z) + (b.y + b.w);
}
// Component c (0..3) of v.
inline float inferd_lane(float4 v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }
//@ end

// The float ops' SiLU: the device's exp and division.
//@ float_silu
inline float4 inferd_silu(float4 g) { return g / (1.0f + exp(-g)); }
//@ end
