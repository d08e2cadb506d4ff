// Activations quantized as the CPU engine quantizes them, for the exact matmul: Q8_0 / Q8_1 blocks
// and Q8_K super-blocks (workers/opencl/ops.cpp; kernels/cpu/scalar.cpp). Both need helpers.cl's
// exact_helpers.
// Only the marked sections are embedded (format: inferd/kernels/opencl_sources.h); notes outside them are not.

// Launched as (T, K / 32): a work-item per block (kernels/cpu/scalar.cpp quantize_q8_1).
//@ quantize_q8
  const int t = get_global_id(0);
  const int blk = get_global_id(1);
  float4 v[8];
  float amax = 0.0f;
  for (int j = 0; j < 8; ++j) {
    v[j] = $x.Read(t, 0, 8 * blk + j);
    const float4 a = fabs(v[j]);
    amax = fmax(fmax(fmax(fmax(amax, a.x), a.y), a.z), a.w);
  }
  const float id = amax != 0.0f ? inferd_div(127.0f, amax) : 0.0f;
  const float d = inferd_div(amax, 127.0f);
  float sum = 0.0f;  // of integers, below 2^13: exact
  for (int j = 0; j < 8; ++j) {
    const float4 q = rint(v[j] * id);  // to nearest even, as nearbyint
    sum += (q.x + q.y) + (q.z + q.w);
    $quants.Write(q, t, 0, 8 * blk + j);
  }
  scales[t * ($x.Channels() / 32) + blk] = (float2)(inferd_round_half(d), inferd_round_half(d * sum));
//@ end

// The floats of one Q8_K block (ops.h kQ8KBlockFloats: d, then the 16 sums), for quantize_q8_k and
// the K-quant exact matmul.
//@ define_q8k_floats
#define Q8K_FLOATS @floats@
//@ end

// Launched as (T, K / 256): a work-item per block (kernels/cpu/scalar.cpp quantize_q8_k).
//@ quantize_q8_k
  const int t = get_global_id(0);
  const int blk = get_global_id(1);
  __global float* out = blocks + (t * ($x.Channels() / 256) + blk) * Q8K_FLOATS;
  float amax = 0.0f, mx = 0.0f;  // the first element of largest magnitude, and it with its sign
  for (int j = 0; j < 64; ++j) {
    const float4 v = $x.Read(t, 0, 64 * blk + j);
    for (int c = 0; c < 4; ++c) {
      const float e = inferd_lane(v, c);
      if (fabs(e) > amax) {
        amax = fabs(e);
        mx = e;
      }
    }
  }
  const float iscale = amax != 0.0f ? inferd_div(-127.0f, mx) : 0.0f;
  for (int g = 0; g < 16; ++g) {
    float bsum = 0.0f;  // of integers below 2^12: exact
    for (int j = 0; j < 4; ++j) {
      // nearest_int(iscale * x) is rint (the 1.5 * 2^23 trick rounds to even), clamped at 127.
      const float4 q = fmin(rint($x.Read(t, 0, 64 * blk + 4 * g + j) * iscale), 127.0f) + 0.0f;
      bsum += (q.x + q.y) + (q.z + q.w);
      $quants.Write(q, t, 0, 64 * blk + 4 * g + j);
    }
    out[1 + g] = bsum;
  }
  out[0] = amax != 0.0f ? inferd_div(1.0f, iscale) : 0.0f;
//@ end
