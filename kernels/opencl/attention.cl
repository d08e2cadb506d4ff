// Attention over the KV cache rope_kv writes: float (one pass, online softmax) and exact (the CPU
// engine's ops::attention_head) (workers/opencl/ops.cpp). A layer's cache is a pool of blocks,
// [block][k|v][kv_head][64][head_dim]; position p of slot s is row p % 64 of block kv_table[s * bps + p / 64].
// Only the marked sections are embedded (format: inferd/kernels/opencl_sources.h); notes outside them are not.

// Both kernels' first helper line: @hd4@ = head_dim / 4.
//@ define_hd4
#define HD4 @hd4@  // slices per head
//@ end

// attention: launched as (lanes * n_head, T) in work-groups of (lanes, 1); lane j takes positions
// j, j + lanes, ... with an online softmax (running maximum m, sum l, and the weighted sum of V rows),
// then the lanes' states are rescaled to the group's maximum and summed in local memory. One pass
// over K and V. Probabilities stay float: llama.cpp rounds them to half before KQV, which needs the
// row's sum first (a second pass over K); tried, it did not change the agreement with the CPU engine
// measurably (whose 8-bit activations dominate the difference; cl_engine_test.cpp).
// The body: attention.head, attention.all (every position of the token), attention.positions,
// attention.store.
//
// attention_part: the float attention split over the positions for GPUs (Ops::attention with partials),
// launched as (lanes * n_head, T, C) in work-groups of (lanes, 1, 1): group (h, t, c) takes chunk c of
// `chunk` positions from the token's first (window) position, exactly as `attention` takes all of them,
// and writes its unnormalized state to part[(t * n_head + h) * C + c]: HD4 float4s of weighted V sums
// scaled to the chunk's maximum, then (maximum, sum of exponentials, 0, 0); a chunk past the token's
// positions writes (-inf, 0). attention_merge then rescales the C states to their common maximum.
// The body: attention.head, attention_part.chunk, attention.positions, attention_part.store.
//@ attention.head
  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int h = get_group_id(0);
  const int t = get_global_id(1);
  const int end = min(kv_pad, pos[t] + 1);  // positions past the token's own are masked
  const int g = h / (n_head / n_head_kv);
  const size_t hd = HD4 * 4;
  __global const int* blocks = kv_table + slot[t] * bps;           // the slot's block table
  __global const half* kc = cache + (size_t)g * 64 * hd;           // head g's K rows in block 0
  __global const half* vc = kc + (size_t)n_head_kv * 64 * hd;      // and its V rows
  const size_t block_halves = (size_t)2 * n_head_kv * 64 * hd;
  __global const half* qp = q + ((size_t)t * n_head + h) * hd;
  // The head's query is the same for every lane: it waits in local memory, not in each lane's registers
  // (with acc[], a head of 128 would need 256 floats per lane).
  for (int i = lid; i < HD4; i += lsz) q_local[i] = vload_half4(i, qp);
  barrier(CLK_LOCAL_MEM_FENCE);
  float4 acc[HD4];
  for (int i = 0; i < HD4; ++i) acc[i] = (float4)(0.0f);
  float m = -INFINITY, l = 0.0f;
  const int start = window > 0 ? max(0, pos[t] + 1 - window) : 0;  // a sliding window's first position
//@ end

//@ attention.all
  const int first = start, last = end;
//@ end

//@ attention_part.chunk
  const int c = get_global_id(2);
  const int first = start + c * chunk;
  const int last = min(end, first + chunk);
//@ end

// The positions [first, last) in the lanes' online softmaxes, then the lanes' states rescaled to the
// group's maximum mx: lane j's sum in lane_sum[j], its weighted V rows in lane_acc[j * HD4 ...].
//@ attention.positions
  for (int p = first + lid; p < last; p += lsz) {
    const size_t row = (size_t)blocks[p >> 6] * block_halves + (size_t)(p & 63) * hd;
    __global const half* kr = kc + row;
    float sc = 0.0f;
    for (int i = 0; i < HD4; ++i) sc += dot(q_local[i], vload_half4(i, kr));
    sc *= scale;
    const float m_new = fmax(m, sc);
    const float corr = exp(m - m_new);  // 0 on the lane's first position (m = -inf)
    const float e = exp(sc - m_new);
    l = l * corr + e;
    __global const half* vr = vc + row;
    for (int i = 0; i < HD4; ++i) acc[i] = acc[i] * corr + e * vload_half4(i, vr);
    m = m_new;
  }
  lane_sum[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  float mx = -INFINITY;
  for (int j = 0; j < lsz; ++j) mx = fmax(mx, lane_sum[j]);
  const float f = m == -INFINITY ? 0.0f : exp(m - mx);  // a lane without positions adds nothing
  barrier(CLK_LOCAL_MEM_FENCE);  // every lane has read the maxima
  lane_sum[lid] = l * f;
  for (int i = 0; i < HD4; ++i) lane_acc[lid * HD4 + i] = acc[i] * f;
  barrier(CLK_LOCAL_MEM_FENCE);
//@ end

//@ attention.store
  float total = 0.0f;
  for (int j = 0; j < lsz; ++j) total += lane_sum[j];
  const float inv = 1.0f / total;  // > 0: the token's own position is never masked
  for (int i = lid; i < HD4; i += lsz) {
    float4 o = (float4)(0.0f);
    for (int j = 0; j < lsz; ++j) o += lane_acc[j * HD4 + i];
    $out.Write(o * inv, t, 0, h * HD4 + i);
  }
//@ end

//@ attention_part.store
  __global float4* dst = part + (((size_t)t * n_head + h) * get_global_size(2) + c) * (HD4 + 1);
  for (int i = lid; i < HD4; i += lsz) {
    float4 o = (float4)(0.0f);
    for (int j = 0; j < lsz; ++j) o += lane_acc[j * HD4 + i];
    dst[i] = o;
  }
  if (lid == 0) {
    float total = 0.0f;
    for (int j = 0; j < lsz; ++j) total += lane_sum[j];
    dst[HD4] = (float4)(mx, total, 0.0f, 0.0f);
  }
//@ end

// attention_merge: launched as (lanes * n_head, T) in work-groups of (lanes, 1): the C chunk states of
// (token t, head h) that attention_part wrote, rescaled to their common maximum, summed in chunk order
// and normalized; lanes take the head's slices.
//@ attention_merge
  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int h = get_group_id(0);
  const int t = get_global_id(1);
  __global const float4* src = part + ((size_t)t * n_head + h) * n_chunks * (HD4 + 1);
  float mx = -INFINITY;
  for (int c = 0; c < n_chunks; ++c) mx = fmax(mx, src[c * (HD4 + 1) + HD4].x);
  float total = 0.0f;
  for (int c = 0; c < n_chunks; ++c) {
    const float4 ml = src[c * (HD4 + 1) + HD4];
    if (ml.x != -INFINITY) total += ml.y * exp(ml.x - mx);
  }
  const float inv = 1.0f / total;  // > 0: the token's own position is in a chunk
  for (int i = lid; i < HD4; i += lsz) {
    float4 o = (float4)(0.0f);
    for (int c = 0; c < n_chunks; ++c) {
      const float cm = src[c * (HD4 + 1) + HD4].x;
      if (cm != -INFINITY) o += src[c * (HD4 + 1) + i] * exp(cm - mx);
    }
    $out.Write(o * inv, t, 0, h * HD4 + i);
  }
//@ end

// attention_exact's q.k of one position as kernels::dot_f32_f16 computes it, per CpuOrder. The
// products of halves are exact in float, so fma and a * b + c agree; only the order of the sums matters.
//@ qk.scalar
inline float inferd_qk(const float4* qv, __global const half* kr) {
  float sum = 0.0f;
  for (int s = 0; s < HD4; ++s) {
    const float4 p = qv[s] * vload_half4(s, kr);
    sum = (((sum + p.x) + p.y) + p.z) + p.w;
  }
  return sum;
}
//@ end

//@ qk.x86
// dot_f32_with: two accumulators of 8 lanes over steps of 16, an 8-element step into the first,
// hsum of their sum, then the last 4 products (head_dim % 8 == 4) one by one.
inline float inferd_qk(const float4* qv, __global const half* kr) {
  float4 a0 = (float4)(0.0f), a1 = (float4)(0.0f), a2 = (float4)(0.0f), a3 = (float4)(0.0f);
  int s = 0;
  for (; s + 4 <= HD4; s += 4) {
    a0 = fma(qv[s], vload_half4(s, kr), a0);
    a1 = fma(qv[s + 1], vload_half4(s + 1, kr), a1);
    a2 = fma(qv[s + 2], vload_half4(s + 2, kr), a2);
    a3 = fma(qv[s + 3], vload_half4(s + 3, kr), a3);
  }
  if (s + 2 <= HD4) {
    a0 = fma(qv[s], vload_half4(s, kr), a0);
    a1 = fma(qv[s + 1], vload_half4(s + 1, kr), a1);
    s += 2;
  }
  float sum = inferd_hsum8(a0 + a2, a1 + a3);
  if (s < HD4) {
    const float4 p = qv[s] * vload_half4(s, kr);
    sum = (((sum + p.x) + p.y) + p.z) + p.w;
  }
  return sum;
}
//@ end

// attention_exact: launched as (lanes * n_head, tokens of this launch) in work-groups of (lanes, 1):
// a group per (token, head), as ops::attention_head. The scores of the group's positions go to
// `scores` (its own row of kv_pad floats), become exponentials and then half-rounded probabilities in
// place; the lanes split the positions for q.k and the exponentials, 16-position chunks for their
// sums (lane 0 adding the chunk sums in double in order, `lanes` chunks a round), and (chain, d)
// pairs for KQV. The body is attention_exact.scores, helpers.cl's reduce(fmax), attention_exact.kqv.
//@ attention_exact.scores
  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int h = get_group_id(0);
  const int tl = get_group_id(1);
  const int t = first_token + tl;
  const int n_kv = pos[t] + 1;  // positions past the token's own are masked
  const int start = window > 0 ? max(0, n_kv - window) : 0;  // and those before a sliding window
  const int g = h / (n_head / n_head_kv);
  const size_t hd = HD4 * 4;
  __global const int* blocks = kv_table + slot[t] * bps;           // the slot's block table
  __global const half* kc = cache + (size_t)g * 64 * hd;           // head g's K rows in block 0
  __global const half* vc = kc + (size_t)n_head_kv * 64 * hd;      // and its V rows
  const size_t block_halves = (size_t)2 * n_head_kv * 64 * hd;
  __global const half* qp = q + ((size_t)t * n_head + h) * hd;
  __global float* sc = scores + ((size_t)tl * n_head + h) * kv_pad;
  float4 qv[HD4];
  for (int i = 0; i < HD4; ++i) qv[i] = vload_half4(i, qp);
  float m = -INFINITY;
  for (int p = start + lid; p < n_kv; p += lsz) {
    const float s = inferd_qk(qv, kc + (size_t)blocks[p >> 6] * block_halves + (size_t)(p & 63) * hd) * scale;
    sc[p] = s;
    m = fmax(m, s);
  }
  scratch[lid] = m;
//@ end

//@ attention_exact.kqv
  const float mx = scratch[0];
  // Every lane has read scratch[0] before it is reused, and every score is visible to every lane.
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  // kernels::exp_sum: 16-position chunks (the last padded with zeros), each reduced as
  // _mm512_reduce_add_ps, the chunk sums added in double in chunk order.
  const int n_chunks = (n_kv + 15) / 16;
  double total = 0.0;  // lane 0's
  for (int first = 0; first < n_chunks; first += lsz) {
    const int c = first + lid;
    float cs = 0.0f;
    if (c < n_chunks) {
      float e[16];
      for (int l = 0; l < 16; ++l) {
        const int p = 16 * c + l;
        const bool in = p >= start && p < n_kv;  // chunks are aligned to position 0, as exp_sum's
        e[l] = in ? inferd_expf(sc[p] - mx) : 0.0f;
        if (in) sc[p] = e[l];
      }
      cs = inferd_reduce16(vload16(0, e));
    }
    scratch[lid] = cs;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
      const int n = min(lsz, n_chunks - first);
      for (int i = 0; i < n; ++i) total += (double)scratch[i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) scratch[0] = (float)(1.0 / total);
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  const float inv = scratch[0];
  for (int p = start + lid; p < n_kv; p += lsz) sc[p] = inferd_round_half(sc[p] * inv);  // as llama.cpp before KQV
  barrier(CLK_GLOBAL_MEM_FENCE);
  // KQV: chain i of dimension d sums positions j = i (mod 16) in order (tinyBLAS's 16 lanes), a block
  // of 64 positions (4 of the chain's) at a time; the products of two halves are exact.
  for (int c = lid; c < 16 * HD4 * 4; c += lsz) {
    const int i = c / (HD4 * 4), d = c % (HD4 * 4);
    float acc = 0.0f;
    for (int b0 = 0; b0 < n_kv; b0 += 64) {
      __global const half* vb = vc + (size_t)blocks[b0 >> 6] * block_halves + d;
      const int end = min(n_kv - b0, 64);
      for (int j = i; j < end; j += 16) {
        if (b0 + j >= start) acc = fma(sc[b0 + j], vload_half(0, vb + (size_t)j * hd), acc);
      }
    }
    chains[c] = acc;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = lid; s < HD4; s += lsz) {
    float o[4];
    for (int l = 0; l < 4; ++l) {
      float v[16];
      for (int i = 0; i < 16; ++i) v[i] = chains[i * HD4 * 4 + 4 * s + l];
      o[l] = inferd_reduce16(vload16(0, v));
    }
    $out.Write((float4)(o[0], o[1], o[2], o[3]), t, 0, h * HD4 + s);
  }
//@ end
