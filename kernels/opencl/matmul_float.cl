// The float matmul y = W x (decode and prefill variants) and get_rows, with weights.cl's codes and
// w_load.<type> (workers/opencl/ops.cpp).
// Only the marked sections are embedded (format: inferd/kernels/opencl_sources.h); notes outside them are not.

// Launched as (lanes * S_O, T) with work-groups (lanes, 1): a group per (output slice, token).
//@ decode
  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int so = get_group_id(0);
  const int t = get_global_id(1);
  const int n_si = $x.Slices();
  float4 r[4];
  float4 acc = (float4)(0.0f);
  for (int si = lid; si < n_si; si += lsz) {
    w_load(wq, ws, wm, wsub, wh, so, si, n_si, r);
    acc += inferd_dot4(r, $x.Read(t, 0, si));
  }
  scratch[lid] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int off = lsz / 2; off > 0; off >>= 1) {
    if (lid < off) scratch[lid] += scratch[lid + off];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) $y.Write(scratch[0], t, 0, so);
//@ end

// Launched as (S_O, ceil(T / 4)): a work-item per (output slice, 4 tokens). Tokens past T read the
// last token (in bounds) and are not written.
//@ prefill
  const int so = get_global_id(0);
  const int t0 = get_global_id(1) * 4;
  const int n_t = $x.Width();
  const int n_si = $x.Slices();
  const int t1 = min(t0 + 1, n_t - 1), t2 = min(t0 + 2, n_t - 1), t3 = min(t0 + 3, n_t - 1);
  float4 r[4];
  float4 a0 = (float4)(0.0f), a1 = (float4)(0.0f), a2 = (float4)(0.0f), a3 = (float4)(0.0f);
  for (int si = 0; si < n_si; ++si) {
    w_load(wq, ws, wm, wsub, wh, so, si, n_si, r);
    a0 += inferd_dot4(r, $x.Read(t0, 0, si));
    a1 += inferd_dot4(r, $x.Read(t1, 0, si));
    a2 += inferd_dot4(r, $x.Read(t2, 0, si));
    a3 += inferd_dot4(r, $x.Read(t3, 0, si));
  }
  $y.Write(a0, t0, 0, so);
  if (t0 + 1 < n_t) $y.Write(a1, t0 + 1, 0, so);
  if (t0 + 2 < n_t) $y.Write(a2, t0 + 2, 0, so);
  if (t0 + 3 < n_t) $y.Write(a3, t0 + 3, 0, so);
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
