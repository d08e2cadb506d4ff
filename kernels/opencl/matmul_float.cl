// The float matmul y = W x (decode and prefill variants) and get_rows, with weights.cl's codes and
// w_load.<type> (workers/opencl/ops.cpp).
// Only the marked sections are embedded (format: inferd/kernels/opencl_sources.h); notes outside them are not.

// Launched as (lanes * ceil(S_O / R), T) with work-groups (lanes, 1), R = @slices@ output slices per group:
// a group per (R output slices, token), its lanes striding over the input slices, each input slice read once
// for the R slices' 4R rows; scratch holds lanes * R * H float4s. A lane loads U = @ahead@ of its input slices
// (and their weights) before it accumulates them, so that U loads are in flight at once. Every (R, U) sums
// each output in the same order (a lane's slices lid, lid + lanes, ... one after the other, then the same
// tree), so gives the same bits (Ops::DecodeShape).
// INFERD_X(si) reads input slice si of token t (Ops::DecodeNorm: normalized on the way, decode.norm);
// INFERD_N_SO is the output's slices (y's, or Q|K|V's for decode.store_rope_kv).
// H = @halves@ matrix slices per output slice: 1 (y = W x), or 2 for a stacked gate|up matrix (2F rows)
// whose output y has F: output slice j sums matrix slices j (gate) and S_O + j (up), each as for H = 1, and
// a store section writes y: decode.store (the sum, with INFERD_OUT's residual) or decode.store_swiglu
// (silu(gate) * up as swiglu_halves computes it: Ops::matmul_swiglu).
//@ decode
  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int so0 = get_group_id(0) * @slices@;
  const int t = get_global_id(1);
  const int n_si = $x.Slices();
  const int n_so = INFERD_N_SO;  // output slices (of each half)
  const int n_r = min(@slices@, n_so - so0);  // the last group's slices may run past S_O
@norm@  float4 r[@ahead@][4];
  float4 xv[@ahead@];
  float4 acc[@halves@ * @slices@];
  for (int j = 0; j < @halves@ * @slices@; ++j) acc[j] = (float4)(0.0f);
  // Every loop below has a bound known when the kernel is generated, so it unrolls and acc[] stays in
  // registers (an index bounded by n_r at run time would put it in memory): slices past n_r are skipped.
  for (int si0 = lid; si0 < n_si; si0 += lsz * @ahead@) {
    for (int h = 0; h < @halves@; ++h) {
      for (int j = 0; j < @slices@; ++j) {
        if (j < n_r) {
          for (int u = 0; u < @ahead@; ++u) {
            const int si = si0 + u * lsz;
            if (si < n_si) {
              if (h == 0 && j == 0) xv[u] = INFERD_X(si);
              w_load(wq, ws, wm, wsub, wh, h * n_so + so0 + j, si, n_si, r[u]);
            }
          }
          for (int u = 0; u < @ahead@; ++u) {
            if (si0 + u * lsz < n_si) acc[h * @slices@ + j] += inferd_dot4(r[u], xv[u]);
          }
        }
      }
    }
  }
  for (int j = 0; j < @halves@ * @slices@; ++j) scratch[j * lsz + lid] = acc[j];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int off = lsz / 2; off > 0; off >>= 1) {
    if (lid < off) {
      for (int j = 0; j < @halves@ * @slices@; ++j) scratch[j * lsz + lid] += scratch[j * lsz + lid + off];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
//@ end

// decode.norm: an RMSNorm of x's row t folded into the decode matmul that reads it (Ops::DecodeNorm). The
// group first sums the row's squares (scratch as lsz floats; freed again before the loop), then each
// input slice is read as INFERD_X defines it: x * scale * nw, as the rms_norm kernel writes it.
//@ decode.norm
  float inferd_ss = 0.0f;
  for (int si = lid; si < n_si; si += lsz) {
    const float4 v = $x.Read(t, 0, si);
    inferd_ss += dot(v, v);  // padding lanes are zero
  }
  __local float* inferd_red = (__local float*)scratch;
  inferd_red[lid] = inferd_ss;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int off = lsz / 2; off > 0; off >>= 1) {
    if (lid < off) inferd_red[lid] += inferd_red[lid + off];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inferd_scale = rsqrt(inferd_red[0] / (float)$nw.Channels() + eps);
  barrier(CLK_LOCAL_MEM_FENCE);  // every lane has read the sum before scratch is written again
//@ end

//@ decode.store
  if (lid < n_r) $y.Write(INFERD_OUT(scratch[lid * lsz], t, so0 + lid), t, 0, so0 + lid);
//@ end

// decode.store_rope_kv: the stacked Q|K|V matmul of a decode step writing what rope_kv's normal RoPE writes
// (Ops::matmul_rope_kv): output slice so is slice s of a Q, K or V head; its sum plus the bias is rotated as
// rope_kv.normal rotates it (Q and K; Q times q_scale) and stored as halves to q_out or the token's cache row.
//@ decode.store_rope_kv
  if (lid < n_r) {
    const int so = so0 + lid;
    const int hd4 = head_dim / 4;
    const int e4 = n_head * hd4, ekv4 = n_head_kv * hd4;
    const float4 x = scratch[lid * lsz] + inferd_bias(bias, 4 * so);
    const int part = so < e4 ? 0 : so < e4 + ekv4 ? 1 : 2;  // Q, K, V
    const int c = part == 0 ? so : part == 1 ? so - e4 : so - e4 - ekv4;
    const int head = c / hd4, s = c % hd4;
    const int p = pos[t];
    const int block = part == 0 ? 0 : kv_table[slot[t] * bps + (p >> 6)];
    __global half* kv_row = cache + ((((size_t)block * 2) * n_head_kv + head) * 64 + (p & 63)) * head_dim;
    if (part == 2) {
      vstore_half4(x, s, kv_row + (size_t)n_head_kv * 64 * head_dim);
    } else {
      const float4 cs = vload4(s, rope + (size_t)t * head_dim);  // angles 2s and 2s + 1
      float4 o;
      o.x = fma(x.x, cs.x, -(x.y * cs.y));
      o.y = fma(x.x, cs.y, x.y * cs.x);
      o.z = fma(x.z, cs.z, -(x.w * cs.w));
      o.w = fma(x.z, cs.w, x.w * cs.z);
      if (part == 0 && q_scale > 0.0f) o = o * q_scale;
      vstore_half4(o, s, part == 0 ? q_out + ((size_t)t * n_head + head) * head_dim : kv_row);
    }
  }
//@ end

//@ decode.store_swiglu
  if (lid < n_r) {
    const float4 g = scratch[lid * lsz], u = scratch[(@slices@ + lid) * lsz];
    $y.Write(inferd_silu(g) * u, t, 0, so0 + lid);
  }
//@ end

// Launched as (S_O, ceil(T / TT)), TT = @tt@ tokens per work-item (Ops::prefill_tokens): a work-item per
// (output slice, TT tokens), each weight slice dequantized once for its TT tokens. Tokens past T read the
// last token (in bounds) and are not written. Every TT sums each output in the same order.
//@ prefill
  const int so = get_global_id(0);
  const int t0 = get_global_id(1) * @tt@;
  const int n_t = $x.Width();
  const int n_si = $x.Slices();
  float4 r[4];
  float4 acc[@tt@];
  for (int i = 0; i < @tt@; ++i) acc[i] = (float4)(0.0f);
  for (int si = 0; si < n_si; ++si) {
    w_load(wq, ws, wm, wsub, wh, so, si, n_si, r);
    for (int i = 0; i < @tt@; ++i) acc[i] += inferd_dot4(r, $x.Read(min(t0 + i, n_t - 1), 0, si));
  }
  for (int i = 0; i < @tt@ && t0 + i < n_t; ++i) $y.Write(INFERD_OUT(acc[i], t0 + i, so), t0 + i, 0, so);
//@ end

// The prefill matmul tiled in local memory (Ops::PrefillKernel::kTiled), for GPUs: launched as
// (16 * ceil(S_O / 16), 16 * ceil(T / 64)) with work-groups (16, 16), a group per tile of 16 output slices
// (64 rows) x 64 tokens. Per chunk of 8 input slices the group stages the tile's weights, dequantized once
// (wtile: [16 slices][8][4 rows] float4s), and its tokens' inputs (xtile: [64 tokens][8] float4s) in local
// memory; work-item (ls, lt) then accumulates output slice ls for tokens 4 lt .. 4 lt + 3 from there. Each
// output sums its input slices in order, one inferd_dot4 at a time, as the `prefill` kernel does.
//@ prefill_tiled
  const int ls = get_local_id(0), lt = get_local_id(1);
  const int lid = lt * 16 + ls;
  const int so0 = get_group_id(0) * 16, t_base = get_group_id(1) * 64;
  const int n_t = $x.Width();
  const int n_si = $x.Slices();
  const int n_so = $y.Slices();
  float4 acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = (float4)(0.0f);
  for (int k0 = 0; k0 < n_si; k0 += 8) {
    const int kc = min(8, n_si - k0);
    if (lid < 128) {  // the weights: one (output slice, input slice) per work-item
      const int wsl = lid / 8, wk = lid % 8;
      float4 r[4] = {(float4)(0.0f), (float4)(0.0f), (float4)(0.0f), (float4)(0.0f)};
      if (so0 + wsl < n_so && wk < kc) w_load(wq, ws, wm, wsub, wh, so0 + wsl, k0 + wk, n_si, r);
      for (int j = 0; j < 4; ++j) wtile[(wsl * 8 + wk) * 4 + j] = r[j];
    }
    for (int e = lid; e < 512; e += 256) {  // the inputs: two (token, input slice) per work-item
      const int xt = e / 8, xk = e % 8;
      xtile[e] = xk < kc ? $x.Read(min(t_base + xt, n_t - 1), 0, k0 + xk) : (float4)(0.0f);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < kc; ++k) {
      float4 r[4];
      for (int j = 0; j < 4; ++j) r[j] = wtile[(ls * 8 + k) * 4 + j];
      for (int i = 0; i < 4; ++i) acc[i] += inferd_dot4(r, xtile[(lt * 4 + i) * 8 + k]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const int so = so0 + ls;
  for (int i = 0; i < 4; ++i) {
    const int t = t_base + lt * 4 + i;
    if (so < n_so && t < n_t) $y.Write(INFERD_OUT(acc[i], t, so), t, 0, so);
  }
//@ end

// The forward pass's embedding lookup. Launched as (T, S): w_load() dequantizes the 4 rows of the
// row's output slice; one is kept.
//@ get_rows
  const int t = get_global_id(0);
  const int si = get_global_id(1);
  const int row = rows[t];
  float4 r[4];
  w_load(wq, ws, wm, wsub, wh, row / 4, si, $dst.Slices(), r);
  $dst.Write(scale != 0.0f ? r[row % 4] * scale : r[row % 4], t, 0, si);  // gemma3 scales its embeddings
//@ end
