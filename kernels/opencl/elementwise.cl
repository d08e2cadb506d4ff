// Element-wise ops and row copies (workers/opencl/ops.cpp).
// Only the marked sections are embedded (format: inferd/kernels/opencl_sources.h); notes outside them are not.

// add, mul, swiglu: dst = @expr@ of the slices va (lhs) and vb (rhs). Launched as (W * B, H, S): the
// batch is the fastest-varying part of the first dimension.
//@ binary
  const int xb = get_global_id(0);
  const int y = get_global_id(1);
  const int s = get_global_id(2);
  const int b = xb % $dst.Batch();
  const int x = xb / $dst.Batch();
  const float4 va = $lhs.Read(x, y, s, b);
  const float4 vb = $rhs.Read(x, y, s, b);
  $dst.Write(@expr@, x, y, s, b);
//@ end

// Token rows of src picked by `rows`.
//@ gather
  const int o = get_global_id(0);
  const int s = get_global_id(1);
  $dst.Write($src.Read(rows[o], 0, s), o, 0, s);
//@ end

// silu(gate) * up over the halves of one gate|up tensor; @silu@ is helpers.cl's inferd_silu4
// (exact_helpers: kernels::silu's operations) or inferd_silu (float_silu).
//@ swiglu_halves
  const int t = get_global_id(0);
  const int s = get_global_id(1);
  const float4 g = $gu.Read(t, 0, s);
  const float4 u = $gu.Read(t, 0, s + $dst.Slices());
  $dst.Write(@silu@(g) * u, t, 0, s);
//@ end

// gelu(gate) * up as the CPU engine's kernels::geglu (ggml's): 0 below -10, the gate itself from 10 on,
// else the F16 table of gelu (`gelu`, 65536 halves, the CPU's own) at the gate rounded to half; then
// times up. The same in both numerics.
//@ geglu.helpers
inline float inferd_geglu1(float x, float u, __global const ushort* gelu) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x * u;
  ushort h;
  vstore_half(x, 0, (half*)&h);  // to nearest even, as the host's conversion
  return vload_half(h, (const __global half*)gelu) * u;
}
inline float4 inferd_geglu4(float4 g, float4 u, __global const ushort* gelu) {
  return (float4)(inferd_geglu1(g.x, u.x, gelu), inferd_geglu1(g.y, u.y, gelu), inferd_geglu1(g.z, u.z, gelu),
                  inferd_geglu1(g.w, u.w, gelu));
}
//@ end

// Over two tensors of one shape, launched as (W, S).
//@ geglu
  const int t = get_global_id(0);
  const int s = get_global_id(1);
  $dst.Write(inferd_geglu4($gate.Read(t, 0, s), $up.Read(t, 0, s), gelu), t, 0, s);
//@ end

// Over the halves of one gate|up tensor, as swiglu_halves.
//@ geglu_halves
  const int t = get_global_id(0);
  const int s = get_global_id(1);
  $dst.Write(inferd_geglu4($gu.Read(t, 0, s), $gu.Read(t, 0, s + $dst.Slices()), gelu), t, 0, s);
//@ end
