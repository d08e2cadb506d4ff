// The weights in the kernels' layout (ops.h: MatmulWeights) read back per data type: as floats for
// the float kernels and get_rows, as integers for the exact matmul (workers/opencl/ops.cpp).
// Only the marked sections are embedded (format: inferd/kernels/opencl_sources.h); notes outside them are not.
// Each loader takes the weight buffers in KernelArgs::weights() order: wq the values (quants), ws the
// scales, wm the mins, wsub the K-quants' sub-block scales, wh the codes' high bits (MatmulWeights::
// high_bits: one bit per code for Q5_0, Q5_1, Q5_K, two for Q6_K; unused, but bound, otherwise).

// The codes of a slice: a ushort p holds one row's 4 low nibbles; the 5- and 6-bit types add the
// high bits from wh. Needed by every loader below but the float ones'.
//@ codes
// The 4 nibbles of v, lowest first, as floats.
inline float4 inferd_nibbles(ushort v) {
  const uint u = v;
  return convert_float4((uint4)(u & 15u, (u >> 4) & 15u, (u >> 8) & 15u, u >> 12));
}
// The four 5-bit codes of row r (Q5_0, Q5_1, Q5_K): its nibbles v and its fifth bits, bits 4r..4r+3 of h.
inline uint4 inferd_code5_u(ushort v, uint h, int r) {
  const uint u = v, b = h >> (4 * r);
  return (uint4)(u & 15u, (u >> 4) & 15u, (u >> 8) & 15u, u >> 12) |
         (((uint4)(b, b >> 1, b >> 2, b >> 3) & 1u) << 4);
}
// The four 6-bit codes of row r (Q6_K): its nibbles v and its two high bits each, bits 8r..8r+7 of h.
inline uint4 inferd_code6_u(ushort v, uint h, int r) {
  const uint u = v, b = h >> (8 * r);
  return (uint4)(u & 15u, (u >> 4) & 15u, (u >> 8) & 15u, u >> 12) |
         (((uint4)(b, b >> 2, b >> 4, b >> 6) & 3u) << 4);
}
// IQ4_NL's and IQ4_XS's 16 non-linear values (ggml's kvalues_iq4nl), indexed by the 4-bit code.
__constant int kInferdIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// The values of the 4 codes (nibbles) of v, lowest first.
inline int4 inferd_iq4_values(ushort v) {
  const uint u = v;
  return (int4)(kInferdIq4Values[u & 15u], kInferdIq4Values[(u >> 4) & 15u], kInferdIq4Values[(u >> 8) & 15u],
                kInferdIq4Values[u >> 12]);
}
// The dot products of the 4 weight rows r with one slice x: one output slice's contribution.
inline float4 inferd_dot4(const float4* r, float4 x) {
  return (float4)(dot(r[0], x), dot(r[1], x), dot(r[2], x), dot(r[3], x));
}
//@ end

// w_load.<type>: the 4 rows of output slice `so` at input slice `si` into r[0..3], dequantized as the
// CPU engine's to_float (kernels/cpu/scalar.cpp) computes them. The block types find their 32-element
// group (blk or g) and, for the K-quants, the super-block sb holding it; Q4_0 and Q5_0 subtract the
// code of value 0 (8, 16), Q4_1 and Q5_1 add their min, Q4_K and Q5_K compute ds * q - ms with
// ds = d * sc and ms = dmin * mn (q4_k_to_float), Q6_K (d * sc) * (q - 32) with sc the scale of the
// element's 16 (q6_k_to_float).
//@ w_load.F32
inline void w_load(__global const float4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int base = (so * n_si + si) * 4;
  r[0] = wq[base];
  r[1] = wq[base + 1];
  r[2] = wq[base + 2];
  r[3] = wq[base + 3];
}
//@ end

//@ w_load.F16
inline void w_load(__global const half* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int base = (so * n_si + si) * 4;
  r[0] = vload_half4(base, wq);
  r[1] = vload_half4(base + 1, wq);
  r[2] = vload_half4(base + 2, wq);
  r[3] = vload_half4(base + 3, wq);
}
//@ end

//@ w_load.BF16
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int base = (so * n_si + si) * 4;
  r[0] = as_float4(convert_uint4(wq[base]) << 16);
  r[1] = as_float4(convert_uint4(wq[base + 1]) << 16);
  r[2] = as_float4(convert_uint4(wq[base + 2]) << 16);
  r[3] = as_float4(convert_uint4(wq[base + 3]) << 16);
}
//@ end

//@ w_load.Q8_0
inline void w_load(__global const char4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int blk = so * (n_si / 8) + si / 8;
  const int base = (blk * 8 + si % 8) * 4;
  const float4 d = ws[blk];
  r[0] = convert_float4(wq[base]) * d.x;
  r[1] = convert_float4(wq[base + 1]) * d.y;
  r[2] = convert_float4(wq[base + 2]) * d.z;
  r[3] = convert_float4(wq[base + 3]) * d.w;
}
//@ end

//@ w_load.Q4_0
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int blk = so * (n_si / 8) + si / 8;
  const ushort4 p = wq[blk * 8 + si % 8];
  const float4 d = ws[blk];
  r[0] = (inferd_nibbles(p.x) - 8.0f) * d.x;
  r[1] = (inferd_nibbles(p.y) - 8.0f) * d.y;
  r[2] = (inferd_nibbles(p.z) - 8.0f) * d.z;
  r[3] = (inferd_nibbles(p.w) - 8.0f) * d.w;
}
//@ end

//@ w_load.Q4_1
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int blk = so * (n_si / 8) + si / 8;
  const ushort4 p = wq[blk * 8 + si % 8];
  const float4 d = ws[blk];
  const float4 m = wm[blk];
  r[0] = inferd_nibbles(p.x) * d.x + m.x;
  r[1] = inferd_nibbles(p.y) * d.y + m.y;
  r[2] = inferd_nibbles(p.z) * d.z + m.z;
  r[3] = inferd_nibbles(p.w) * d.w + m.w;
}
//@ end

//@ w_load.Q5_0
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int blk = so * (n_si / 8) + si / 8;
  const ushort4 p = wq[blk * 8 + si % 8];
  const uint h = wh[blk * 8 + si % 8];
  const float4 d = ws[blk];
  r[0] = (convert_float4(inferd_code5_u(p.x, h, 0)) - 16.0f) * d.x;
  r[1] = (convert_float4(inferd_code5_u(p.y, h, 1)) - 16.0f) * d.y;
  r[2] = (convert_float4(inferd_code5_u(p.z, h, 2)) - 16.0f) * d.z;
  r[3] = (convert_float4(inferd_code5_u(p.w, h, 3)) - 16.0f) * d.w;
}
//@ end

//@ w_load.Q5_1
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int blk = so * (n_si / 8) + si / 8;
  const ushort4 p = wq[blk * 8 + si % 8];
  const uint h = wh[blk * 8 + si % 8];
  const float4 d = ws[blk];
  const float4 m = wm[blk];
  r[0] = convert_float4(inferd_code5_u(p.x, h, 0)) * d.x + m.x;
  r[1] = convert_float4(inferd_code5_u(p.y, h, 1)) * d.y + m.y;
  r[2] = convert_float4(inferd_code5_u(p.z, h, 2)) * d.z + m.z;
  r[3] = convert_float4(inferd_code5_u(p.w, h, 3)) * d.w + m.w;
}
//@ end

//@ w_load.Q4_K
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int g = so * (n_si / 8) + si / 8;
  const int sb = so * (n_si / 64) + si / 64;
  const ushort4 p = wq[g * 8 + si % 8];
  const float4 ds = ws[sb] * convert_float4(wsub[sb * 16 + g % 8]);
  const float4 ms = wm[sb] * convert_float4(wsub[sb * 16 + 8 + g % 8]);
  r[0] = convert_float4(convert_uint4(inferd_nibbles(p.x))) * ds.x - ms.x;
  r[1] = convert_float4(convert_uint4(inferd_nibbles(p.y))) * ds.y - ms.y;
  r[2] = convert_float4(convert_uint4(inferd_nibbles(p.z))) * ds.z - ms.z;
  r[3] = convert_float4(convert_uint4(inferd_nibbles(p.w))) * ds.w - ms.w;
}
//@ end

//@ w_load.Q5_K
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int g = so * (n_si / 8) + si / 8;
  const int sb = so * (n_si / 64) + si / 64;
  const ushort4 p = wq[g * 8 + si % 8];
  const uint h = wh[g * 8 + si % 8];
  const float4 ds = ws[sb] * convert_float4(wsub[sb * 16 + g % 8]);
  const float4 ms = wm[sb] * convert_float4(wsub[sb * 16 + 8 + g % 8]);
  r[0] = convert_float4(inferd_code5_u(p.x, h, 0)) * ds.x - ms.x;
  r[1] = convert_float4(inferd_code5_u(p.y, h, 1)) * ds.y - ms.y;
  r[2] = convert_float4(inferd_code5_u(p.z, h, 2)) * ds.z - ms.z;
  r[3] = convert_float4(inferd_code5_u(p.w, h, 3)) * ds.w - ms.w;
}
//@ end

//@ w_load.Q6_K
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const uint* wh, int so, int si, int n_si, float4* r) {
  const int g = so * (n_si / 8) + si / 8;
  const int sb = so * (n_si / 64) + si / 64;
  const ushort4 p = wq[g * 8 + si % 8];
  const uint h = wh[g * 8 + si % 8];
  const float4 ds = ws[sb] * convert_float4(wsub[sb * 16 + (si % 64) / 4]);
  r[0] = ds.x * (convert_float4(inferd_code6_u(p.x, h, 0)) - 32.0f);
  r[1] = ds.y * (convert_float4(inferd_code6_u(p.y, h, 1)) - 32.0f);
  r[2] = ds.z * (convert_float4(inferd_code6_u(p.z, h, 2)) - 32.0f);
  r[3] = ds.w * (convert_float4(inferd_code6_u(p.w, h, 3)) - 32.0f);
}
//@ end

// Q2_K: codes 0..3 in the nibbles; per 16 elements a scale sc and a min mn (wsub [S_O][B][32]: the 16
// scales, then the 16 mins); value (d * sc) * q - dmin * mn (q2_k_to_float).
//@ w_load.Q2_K
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int g = so * (n_si / 8) + si / 8;
  const int sb = so * (n_si / 64) + si / 64;
  const ushort4 p = wq[g * 8 + si % 8];
  const float4 ds = ws[sb] * convert_float4(wsub[sb * 32 + (si % 64) / 4]);
  const float4 ms = wm[sb] * convert_float4(wsub[sb * 32 + 16 + (si % 64) / 4]);
  r[0] = inferd_nibbles(p.x) * ds.x - ms.x;
  r[1] = inferd_nibbles(p.y) * ds.y - ms.y;
  r[2] = inferd_nibbles(p.z) * ds.z - ms.z;
  r[3] = inferd_nibbles(p.w) * ds.w - ms.w;
}
//@ end

// Q3_K: codes value + 4 (0..7) in the nibbles; the signed scale (sc - 32) of each 16 elements in wsub
// [S_O][B][16]; value (d * sc) * (q - 4) (q3_k_to_float).
//@ w_load.Q3_K
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int g = so * (n_si / 8) + si / 8;
  const int sb = so * (n_si / 64) + si / 64;
  const ushort4 p = wq[g * 8 + si % 8];
  const float4 ds = ws[sb] * convert_float4(wsub[sb * 16 + (si % 64) / 4]);
  r[0] = ds.x * (inferd_nibbles(p.x) - 4.0f);
  r[1] = ds.y * (inferd_nibbles(p.y) - 4.0f);
  r[2] = ds.z * (inferd_nibbles(p.z) - 4.0f);
  r[3] = ds.w * (inferd_nibbles(p.w) - 4.0f);
}
//@ end

// IQ4_NL: the codes in the nibbles, d per 32 elements as Q4_0; value d * kvalues[q] (iq4_nl_to_float).
//@ w_load.IQ4_NL
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int blk = so * (n_si / 8) + si / 8;
  const ushort4 p = wq[blk * 8 + si % 8];
  const float4 d = ws[blk];
  r[0] = d.x * convert_float4(inferd_iq4_values(p.x));
  r[1] = d.y * convert_float4(inferd_iq4_values(p.y));
  r[2] = d.z * convert_float4(inferd_iq4_values(p.z));
  r[3] = d.w * convert_float4(inferd_iq4_values(p.w));
}
//@ end

// IQ4_XS: the codes in the nibbles; the signed scale (ls - 32) of each 32 elements in wsub [S_O][B][16]
// (entries 0..7); value (d * ls) * kvalues[q] (iq4_xs_to_float).
//@ w_load.IQ4_XS
inline void w_load(__global const ushort4* wq, __global const float4* ws, __global const float4* wm, __global const char4* wsub, __global const ushort* wh, int so, int si, int n_si, float4* r) {
  const int g = so * (n_si / 8) + si / 8;
  const int sb = so * (n_si / 64) + si / 64;
  const ushort4 p = wq[g * 8 + si % 8];
  const float4 ds = ws[sb] * convert_float4(wsub[sb * 16 + (si % 64) / 8]);
  r[0] = ds.x * convert_float4(inferd_iq4_values(p.x));
  r[1] = ds.y * convert_float4(inferd_iq4_values(p.y));
  r[2] = ds.z * convert_float4(inferd_iq4_values(p.z));
  r[3] = ds.w * convert_float4(inferd_iq4_values(p.w));
}
//@ end

// w_int.<type> (floats) and w_int8.<type> (char4, IntDot::kInt8): the integer quants of the 4 rows of
// block `blk` (so * blocks + b) at its slice l, for the exact matmul of the 32-element block types:
// the signed values (Q8_0, Q4_0, Q5_0), or the codes of the types with a min (Q4_1, Q5_1).
// w_int8 of the nibble types needs matmul_exact.cl's int_dot.helpers (inferd_nibbles_c).
//@ w_int.Q8_0
inline void w_int(__global const char4* wq, __global const ushort* wh, int blk, int l, float4* r) {
  const int base = (blk * 8 + l) * 4;
  r[0] = convert_float4(wq[base + 0]);
  r[1] = convert_float4(wq[base + 1]);
  r[2] = convert_float4(wq[base + 2]);
  r[3] = convert_float4(wq[base + 3]);
}
//@ end

//@ w_int8.Q8_0
inline void w_int8(__global const char4* wq, __global const ushort* wh, int blk, int l, char4* r) {
  const int base = (blk * 8 + l) * 4;
  r[0] = (wq[base + 0]);
  r[1] = (wq[base + 1]);
  r[2] = (wq[base + 2]);
  r[3] = (wq[base + 3]);
}
//@ end

//@ w_int.Q4_0
inline void w_int(__global const ushort4* wq, __global const ushort* wh, int blk, int l, float4* r) {
  const ushort4 p = wq[blk * 8 + l];
  r[0] = inferd_nibbles(p.x) - 8.0f;
  r[1] = inferd_nibbles(p.y) - 8.0f;
  r[2] = inferd_nibbles(p.z) - 8.0f;
  r[3] = inferd_nibbles(p.w) - 8.0f;
}
//@ end

//@ w_int8.Q4_0
inline void w_int8(__global const ushort4* wq, __global const ushort* wh, int blk, int l, char4* r) {
  const ushort4 p = wq[blk * 8 + l];
  r[0] = inferd_nibbles_c(p.x) - (char4)(8);
  r[1] = inferd_nibbles_c(p.y) - (char4)(8);
  r[2] = inferd_nibbles_c(p.z) - (char4)(8);
  r[3] = inferd_nibbles_c(p.w) - (char4)(8);
}
//@ end

//@ w_int.Q4_1
inline void w_int(__global const ushort4* wq, __global const ushort* wh, int blk, int l, float4* r) {
  const ushort4 p = wq[blk * 8 + l];
  r[0] = inferd_nibbles(p.x);
  r[1] = inferd_nibbles(p.y);
  r[2] = inferd_nibbles(p.z);
  r[3] = inferd_nibbles(p.w);
}
//@ end

//@ w_int8.Q4_1
inline void w_int8(__global const ushort4* wq, __global const ushort* wh, int blk, int l, char4* r) {
  const ushort4 p = wq[blk * 8 + l];
  r[0] = inferd_nibbles_c(p.x);
  r[1] = inferd_nibbles_c(p.y);
  r[2] = inferd_nibbles_c(p.z);
  r[3] = inferd_nibbles_c(p.w);
}
//@ end

//@ w_int.Q5_0
inline void w_int(__global const ushort4* wq, __global const ushort* wh, int blk, int l, float4* r) {
  const ushort4 p = wq[blk * 8 + l];
  const uint h = wh[blk * 8 + l];
  r[0] = convert_float4(inferd_code5_u(p.x, h, 0)) - 16.0f;
  r[1] = convert_float4(inferd_code5_u(p.y, h, 1)) - 16.0f;
  r[2] = convert_float4(inferd_code5_u(p.z, h, 2)) - 16.0f;
  r[3] = convert_float4(inferd_code5_u(p.w, h, 3)) - 16.0f;
}
//@ end

//@ w_int8.Q5_0
inline void w_int8(__global const ushort4* wq, __global const ushort* wh, int blk, int l, char4* r) {
  const ushort4 p = wq[blk * 8 + l];
  const uint h = wh[blk * 8 + l];
  r[0] = convert_char4(inferd_code5_u(p.x, h, 0)) - (char4)(16);
  r[1] = convert_char4(inferd_code5_u(p.y, h, 1)) - (char4)(16);
  r[2] = convert_char4(inferd_code5_u(p.z, h, 2)) - (char4)(16);
  r[3] = convert_char4(inferd_code5_u(p.w, h, 3)) - (char4)(16);
}
//@ end

//@ w_int.Q5_1
inline void w_int(__global const ushort4* wq, __global const ushort* wh, int blk, int l, float4* r) {
  const ushort4 p = wq[blk * 8 + l];
  const uint h = wh[blk * 8 + l];
  r[0] = convert_float4(inferd_code5_u(p.x, h, 0));
  r[1] = convert_float4(inferd_code5_u(p.y, h, 1));
  r[2] = convert_float4(inferd_code5_u(p.z, h, 2));
  r[3] = convert_float4(inferd_code5_u(p.w, h, 3));
}
//@ end

//@ w_int8.Q5_1
inline void w_int8(__global const ushort4* wq, __global const ushort* wh, int blk, int l, char4* r) {
  const ushort4 p = wq[blk * 8 + l];
  const uint h = wh[blk * 8 + l];
  r[0] = convert_char4(inferd_code5_u(p.x, h, 0));
  r[1] = convert_char4(inferd_code5_u(p.y, h, 1));
  r[2] = convert_char4(inferd_code5_u(p.z, h, 2));
  r[3] = convert_char4(inferd_code5_u(p.w, h, 3));
}
//@ end

//@ w_int.IQ4_NL
inline void w_int(__global const ushort4* wq, __global const ushort* wh, int blk, int l, float4* r) {
  const ushort4 p = wq[blk * 8 + l];
  r[0] = convert_float4(inferd_iq4_values(p.x));
  r[1] = convert_float4(inferd_iq4_values(p.y));
  r[2] = convert_float4(inferd_iq4_values(p.z));
  r[3] = convert_float4(inferd_iq4_values(p.w));
}
//@ end

//@ w_int8.IQ4_NL
inline void w_int8(__global const ushort4* wq, __global const ushort* wh, int blk, int l, char4* r) {
  const ushort4 p = wq[blk * 8 + l];
  r[0] = convert_char4(inferd_iq4_values(p.x));
  r[1] = convert_char4(inferd_iq4_values(p.y));
  r[2] = convert_char4(inferd_iq4_values(p.z));
  r[3] = convert_char4(inferd_iq4_values(p.w));
}
//@ end

// w_code.<type>: the integer codes of the 4 rows at slice l of 32-element group g (so * G + group),
// for the exact matmul of the K-quants (Q6_K: value + 32; Q3_K and IQ4_XS: the signed values).
//@ w_code.Q4_K
inline void w_code(__global const ushort4* wq, __global const ushort* wh, int g, int l, int4* r) {
  const ushort4 p = wq[g * 8 + l];
  r[0] = convert_int4(convert_uint4(inferd_nibbles(p.x)));
  r[1] = convert_int4(convert_uint4(inferd_nibbles(p.y)));
  r[2] = convert_int4(convert_uint4(inferd_nibbles(p.z)));
  r[3] = convert_int4(convert_uint4(inferd_nibbles(p.w)));
}
//@ end

//@ w_code.Q5_K
inline void w_code(__global const ushort4* wq, __global const ushort* wh, int g, int l, int4* r) {
  const ushort4 p = wq[g * 8 + l];
  const uint h = wh[g * 8 + l];
  r[0] = convert_int4(inferd_code5_u(p.x, h, 0));
  r[1] = convert_int4(inferd_code5_u(p.y, h, 1));
  r[2] = convert_int4(inferd_code5_u(p.z, h, 2));
  r[3] = convert_int4(inferd_code5_u(p.w, h, 3));
}
//@ end

//@ w_code.Q6_K
inline void w_code(__global const ushort4* wq, __global const uint* wh, int g, int l, int4* r) {
  const ushort4 p = wq[g * 8 + l];
  const uint h = wh[g * 8 + l];
  r[0] = convert_int4(inferd_code6_u(p.x, h, 0));
  r[1] = convert_int4(inferd_code6_u(p.y, h, 1));
  r[2] = convert_int4(inferd_code6_u(p.z, h, 2));
  r[3] = convert_int4(inferd_code6_u(p.w, h, 3));
}
//@ end

//@ w_code.Q2_K
inline void w_code(__global const ushort4* wq, __global const ushort* wh, int g, int l, int4* r) {
  const ushort4 p = wq[g * 8 + l];
  r[0] = convert_int4(convert_uint4(inferd_nibbles(p.x)));
  r[1] = convert_int4(convert_uint4(inferd_nibbles(p.y)));
  r[2] = convert_int4(convert_uint4(inferd_nibbles(p.z)));
  r[3] = convert_int4(convert_uint4(inferd_nibbles(p.w)));
}
//@ end

//@ w_code.Q3_K
inline void w_code(__global const ushort4* wq, __global const ushort* wh, int g, int l, int4* r) {
  const ushort4 p = wq[g * 8 + l];
  r[0] = convert_int4(convert_uint4(inferd_nibbles(p.x))) - 4;
  r[1] = convert_int4(convert_uint4(inferd_nibbles(p.y))) - 4;
  r[2] = convert_int4(convert_uint4(inferd_nibbles(p.z))) - 4;
  r[3] = convert_int4(convert_uint4(inferd_nibbles(p.w))) - 4;
}
//@ end

//@ w_code.IQ4_XS
inline void w_code(__global const ushort4* wq, __global const ushort* wh, int g, int l, int4* r) {
  const ushort4 p = wq[g * 8 + l];
  r[0] = inferd_iq4_values(p.x);
  r[1] = inferd_iq4_values(p.y);
  r[2] = inferd_iq4_values(p.z);
  r[3] = inferd_iq4_values(p.w);
}
//@ end
