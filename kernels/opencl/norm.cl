// Row ops: RMS norm and softmax, float and exact (workers/opencl/ops.cpp). Each body starts with
// helpers.cl's row_prologue; the float ones reduce with helpers.cl's reduce between their parts.
// Only the marked sections are embedded (format: inferd/kernels/opencl_sources.h); notes outside them are not.

//@ add
inline float inferd_add(float a, float b) { return a + b; }
//@ end

// The RMS norms normalize each group of a row: the weight's channels, the whole row or (Q/K norms) each
// head of it (group_slices = the weight's slices). Launched as (lanes, rows * groups); the group's
// slices are [s0, s0 + n_s). Like row_prologue, for rms_norm and rms_norm_exact.
//@ group_prologue
  const int lid = get_local_id(0);
  const int lsz = get_local_size(0);
  const int n_groups = $src.Slices() / group_slices;
  const int grp = get_global_id(1) % n_groups;
  const int row = get_global_id(1) / n_groups;
  const int b = row % $src.Batch();
  const int x = (row / $src.Batch()) % $src.Width();
  const int y = row / ($src.Batch() * $src.Width());
  const int n_s = group_slices;
  const int s0 = grp * group_slices;
//@ end

// rms_norm: group_prologue, sum_squares, reduce(inferd_add), scale.
//@ rms_norm.sum_squares
  float acc = 0.0f;
  for (int s = lid; s < n_s; s += lsz) {
    const float4 v = $src.Read(x, y, s0 + s, b);
    acc += dot(v, v);  // padding lanes are zero
  }
  scratch[lid] = acc;
//@ end

//@ rms_norm.scale
  const float scale = rsqrt(scratch[0] / (float)$weight.Channels() + eps);
  for (int s = lid; s < n_s; s += lsz) {
    $dst.Write($src.Read(x, y, s0 + s, b) * scale * $weight.Read(0, 0, s), x, y, s0 + s, b);
  }
//@ end

// softmax: row_prologue, max, reduce(fmax), sum, reduce(inferd_add), normalize.
//@ softmax.helpers
inline float inferd_add(float a, float b) { return a + b; }
// Lanes past the row's `c` channels (the last slice's padding) become -inf: they must not count.
inline float4 inferd_mask_lanes(float4 v, int s, int c) {
  const int n = c - 4 * s;
  if (n < 4) v.w = -INFINITY;
  if (n < 3) v.z = -INFINITY;
  if (n < 2) v.y = -INFINITY;
  return v;
}
//@ end

//@ softmax.max
  const int c = $src.Channels();
  const int my = $mask.Height() == 1 ? 0 : y;
  const int mb = $mask.Batch() == 1 ? 0 : b;
  float m = -INFINITY;
  for (int s = lid; s < n_s; s += lsz) {
    const float4 v = inferd_mask_lanes($src.Read(x, y, s, b) * scale + $mask.Read(x, my, s, mb), s, c);
    m = fmax(m, fmax(fmax(v.x, v.y), fmax(v.z, v.w)));
  }
  scratch[lid] = m;
//@ end

//@ softmax.sum
  const float row_max = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);  // every lane has read scratch[0] before it is reused
  const bool empty = row_max == -INFINITY;  // the whole row is masked
  float sum = 0.0f;
  for (int s = lid; s < n_s && !empty; s += lsz) {
    const float4 v = inferd_mask_lanes($src.Read(x, y, s, b) * scale + $mask.Read(x, my, s, mb), s, c);
    const float4 e = exp(v - row_max);
    sum += (e.x + e.y) + (e.z + e.w);
  }
  scratch[lid] = sum;
//@ end

//@ softmax.normalize
  const float inv = empty ? 0.0f : 1.0f / scratch[0];
  for (int s = lid; s < n_s; s += lsz) {
    const float4 v = inferd_mask_lanes($src.Read(x, y, s, b) * scale + $mask.Read(x, my, s, mb), s, c);
    $dst.Write(empty ? (float4)(0.0f) : exp(v - row_max) * inv, x, y, s, b);
  }
//@ end

// rms_norm_exact (with helpers.cl's exact_helpers): group_prologue, then this. One lane sums the row:
// the order of a double sum matters as much as a float one's.
//@ rms_norm_exact
  if (lid == 0) {
    double sum = 0.0;  // ops::rms_norm: float squares, summed in double in channel order
    for (int s = 0; s < n_s; ++s) {
      const float4 v = $src.Read(x, y, s0 + s, b);  // padding lanes add +0
      sum += (double)(v.x * v.x);
      sum += (double)(v.y * v.y);
      sum += (double)(v.z * v.z);
      sum += (double)(v.w * v.w);
    }
    const float mean = (float)(sum / (double)$weight.Channels());
    scratch[0] = inferd_div(1.0f, inferd_sqrt(mean + eps));
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const float scale = scratch[0];
  for (int s = lid; s < n_s; s += lsz) {
    $dst.Write($src.Read(x, y, s0 + s, b) * scale * $weight.Read(0, 0, s), x, y, s0 + s, b);
  }
//@ end
