// Rotary position embedding: the float rope op, and rope_kv, which ropes Q and K of the forward pass
// and writes K and V to the KV cache (workers/opencl/ops.cpp).
// Only the marked sections are embedded (format: inferd/kernels/opencl_sources.h); notes outside them are not.

// rope: angles follow ggml's recurrence theta_i = pos * ts * ts * ... (i factors, rounded after each
// multiplication) rather than pos * pow(ts, i): the same floats as the CPU reference, so that only
// sin and cos differ.
// llama's (adjacent pairs): one work-item per slice, pairs (0,1) and (2,3) of the slice, i.e. pair
// indices 2s and 2s + 1.
//@ rope.normal
  const int x = get_global_id(0);
  const int y = get_global_id(1);
  const int s = get_global_id(2);
  float theta = (float)pos[x];
  for (int i = 0; i < 2 * s; ++i) theta *= theta_scale;
  const float theta1 = theta * theta_scale;
  float c0, c1;
  const float s0 = sincos(theta, &c0);
  const float s1 = sincos(theta1, &c1);
  const float4 v = $src.Read(x, y, s);
  float4 o;
  o.x = fma(v.x, c0, -(v.y * s0));
  o.y = fma(v.x, s0, v.y * c0);
  o.z = fma(v.z, c1, -(v.w * s1));
  o.w = fma(v.z, s1, v.w * c1);
  $dst.Write(o, x, y, s);
//@ end

// NeoX's (halves): one work-item per slice of the first half: pairs p = 4s + lane rotate
// (x[p], x[p + half]).
//@ rope.neox
  const int x = get_global_id(0);
  const int y = get_global_id(1);
  const int s = get_global_id(2);
  const int half_s = $src.Channels() / 8;  // slices per half
  float theta = (float)pos[x];
  for (int i = 0; i < 4 * s; ++i) theta *= theta_scale;
  float4 t;
  t.x = theta;
  t.y = t.x * theta_scale;
  t.z = t.y * theta_scale;
  t.w = t.z * theta_scale;
  float4 c;
  const float4 sn = sincos(t, &c);
  const float4 lo = $src.Read(x, y, s);
  const float4 hi = $src.Read(x, y, s + half_s);
  $dst.Write(fma(lo, c, -(hi * sn)), x, y, s);
  $dst.Write(fma(lo, sn, hi * c), x, y, s + half_s);
//@ end

// rope_kv: one work-item per (token, head, unit): a unit is one slice (two rotated pairs) of a head
// for llama's rope, one slice of each half for NeoX's. Q heads come first, then KV heads, whose
// work-items also copy V into the cache: a layer's pool of blocks [block][k|v][kv_head][64][head_dim],
// position p of the token's slot in block kv_table[slot * bps + p / 64] at row p % 64. The cos and sin
// come from the host (rope_table: the CPU engine's own values); the rotation is kernels::rope_rotate's:
// a' = fma(a, cos, -(b * sin)), b' = fma(a, sin, b * cos). q_scale > 0 multiplies the rotated Q before
// it is rounded to half (the CPU engine's q_as_half).
// The body is rope_kv.head, then rope_kv.normal or rope_kv.neox.
//@ rope_kv.helpers
// The bias of channels [c, c + 4) of Q|K|V, or 0.
inline float4 inferd_bias(__global const float* bias, int c) {
  return bias != 0 ? vload4(0, bias + c) : (float4)(0.0f);
}
//@ end

//@ rope_kv.head
  const int t = get_global_id(0);
  const int hh = get_global_id(1);
  const int s = get_global_id(2);
  const int hd4 = head_dim / 4;
  const int n_embd = n_head * head_dim, n_embd_kv = n_head_kv * head_dim;
  const bool is_q = hh < n_head;
  const int head = is_q ? hh : hh - n_head;
  const int p = pos[t];
  const int block = is_q ? 0 : kv_table[slot[t] * bps + (p >> 6)];  // Q rows do not go to the cache
  __global half* kv_row = cache + ((((size_t)block * 2) * n_head_kv + head) * 64 + (p & 63)) * head_dim;
  __global half* v_row = kv_row + (size_t)n_head_kv * 64 * head_dim;
  __global half* q_row = q_out + ((size_t)t * n_head + head) * head_dim;
  __global const float* trig = rope + (size_t)t * head_dim;  // (cos, sin) of the token's head_dim / 2 angles
//@ end

//@ rope_kv.normal
  const float4 cs = vload4(s, trig);  // angles 2s and 2s + 1
  float4 x;
  if (is_q) {
    x = $q.Read(t, 0, q_slice + head * hd4 + s) + inferd_bias(bias, head * head_dim + 4 * s);
  } else {
    x = $k.Read(t, 0, k_slice + head * hd4 + s) + inferd_bias(bias, n_embd + head * head_dim + 4 * s);
    const float4 vx = $v.Read(t, 0, v_slice + head * hd4 + s) + inferd_bias(bias, n_embd + n_embd_kv + head * head_dim + 4 * s);
    vstore_half4(vx, s, v_row);
  }
  float4 o;
  o.x = fma(x.x, cs.x, -(x.y * cs.y));
  o.y = fma(x.x, cs.y, x.y * cs.x);
  o.z = fma(x.z, cs.z, -(x.w * cs.w));
  o.w = fma(x.z, cs.w, x.w * cs.z);
  if (is_q && q_scale > 0.0f) o = o * q_scale;  // Q scaled before its rounding (gemma3, phi3)
  vstore_half4(o, s, is_q ? q_row : kv_row);
//@ end

//@ rope_kv.neox
  const int half_s = head_dim / 8;
  const float4 t0 = vload4(2 * s, trig), t1 = vload4(2 * s + 1, trig);  // angles 4s .. 4s + 3
  const float4 c = (float4)(t0.x, t0.z, t1.x, t1.z);
  const float4 sn = (float4)(t0.y, t0.w, t1.y, t1.w);
  float4 lo, hi;
  if (is_q) {
    lo = $q.Read(t, 0, q_slice + head * hd4 + s) + inferd_bias(bias, head * head_dim + 4 * s);
    hi = $q.Read(t, 0, q_slice + head * hd4 + s + half_s) + inferd_bias(bias, head * head_dim + 4 * (s + half_s));
  } else {
    const int kb = n_embd + head * head_dim, vb = n_embd + n_embd_kv + head * head_dim;
    lo = $k.Read(t, 0, k_slice + head * hd4 + s) + inferd_bias(bias, kb + 4 * s);
    hi = $k.Read(t, 0, k_slice + head * hd4 + s + half_s) + inferd_bias(bias, kb + 4 * (s + half_s));
    vstore_half4($v.Read(t, 0, v_slice + head * hd4 + s) + inferd_bias(bias, vb + 4 * s), s, v_row);
    vstore_half4($v.Read(t, 0, v_slice + head * hd4 + s + half_s) + inferd_bias(bias, vb + 4 * (s + half_s)),
                 s + half_s, v_row);
  }
  __global half* out = is_q ? q_row : kv_row;
  const float qs = is_q && q_scale > 0.0f ? q_scale : 1.0f;  // Q scaled before its rounding (phi3); x 1 is exact
  vstore_half4(fma(lo, c, -(hi * sn)) * qs, s, out);
  vstore_half4(fma(lo, sn, hi * c) * qs, s + half_s, out);
//@ end
