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
