// inferd-gemm-bench: single-thread GMAC/s of the prefill GEMM (gemm.h) against the dot-kernel path.
//
//   inferd-gemm-bench [gemm] [--k K] [--rows R] [--m M] [--reps N] [--type NAME]
//
// For each quantized type with a GEMM a rows x k weight matrix (default 5632 x 2048, larger than L2) is multiplied
// with m (default 128) quantized activation rows, once with gemm_kernel() over the whole row range
// and once the way the engine runs prefill without it: for each block of 32 rows, for each group of
// kMaxDotRows activation rows, for each row, TypeKernels::dot. Best of N repetitions. Types with an
// interleaved layout (inferd/weight_layout.h, as the weights segment stores them) are also run from
// that layout: the "x16" column. INFERD_MATMUL_ORDER=vec_dot|repacked picks the order measured (default repacked:
// llama.cpp's default, inferd/kernels/cpu.h). --type measures one type only (its name as dtype_name gives it: Q4_K).
#include <algorithm>
#include <cstddef>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "inferd/kernels/cpu.h"
#include "inferd/kernels/gemm.h"
#include "inferd/kernels/quantize.h"
#include "inferd/weight_layout.h"

namespace {

using inferd::DType;
using namespace inferd::kernels;

template <typename F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t k = 2048, rows = 5632, m = 128;
  int reps = 5;
  std::string only_type;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (a == "gemm") continue;
    if (a == "--k") k = next();
    else if (a == "--rows") rows = next();
    else if (a == "--m") m = next();
    else if (a == "--reps") reps = static_cast<int>(next());
    else if (a == "--type" && i + 1 < argc) only_type = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [gemm] [--k K] [--rows R] [--m M] [--reps N] [--type NAME]\n", argv[0]);
      return 2;
    }
  }
  if (k <= 0 || k % 32 != 0 || rows <= 0 || m <= 0 || reps <= 0) {
    std::fprintf(stderr, "k must be a positive multiple of 32; rows, m, reps positive\n");
    return 2;
  }
  std::printf("gemm: k %lld rows %lld m %lld, single thread, isa %s\n", static_cast<long long>(k),
              static_cast<long long>(rows), static_cast<long long>(m), isa_name(best_isa()));
  const double macs = static_cast<double>(k) * static_cast<double>(rows) * static_cast<double>(m);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ2_K,
                     DType::kQ3_K, DType::kIQ4_XS, DType::kIQ4_NL}) {
    if (!only_type.empty() && only_type != inferd::dtype_name(type)) continue;
    if (k % inferd::dtype_info(type)->block_size != 0) continue;  // K-quants need k % 256 == 0
    // The matmul order of the environment (INFERD_MATMUL_ORDER, inferd/kernels/cpu.h) for this matrix.
    const MatmulOrder order = matmul_order_for(type, rows);
    const TypeKernels* tk = type_kernels(type, best_isa(), order);
    const size_t w_row = inferd::dtype_row_bytes(type, k);
    std::vector<uint8_t> w(w_row * rows);
    std::vector<float> x(k);
    if (has_quantize_ref(type)) {
      for (int64_t r = 0; r < rows; ++r) {
        for (auto& v : x) v = nd(rng) * 0.05f;
        quantize_row_ref(type, x.data(), w.data() + r * w_row, k);
      }
    } else {
      // K-quants and IQ4_NL (no reference quantizer): random codes and scales, every fp16 d / dmin ~0.0078.
      for (auto& b : w) b = static_cast<uint8_t>(rng());
      const size_t block = inferd::dtype_info(type)->block_bytes;
      const inferd::fp16_t d = 0x2000;
      for (size_t off = 0; off < w.size(); off += block) {
        if (type == DType::kQ6_K) {
          std::memcpy(&w[off + offsetof(inferd::BlockQ6_K, d)], &d, 2);
        } else if (type == DType::kQ3_K) {
          std::memcpy(&w[off + offsetof(inferd::BlockQ3_K, d)], &d, 2);
        } else if (type == DType::kIQ4_XS) {
          std::memcpy(&w[off + offsetof(inferd::BlockIQ4_XS, d)], &d, 2);
        } else if (type == DType::kQ2_K) {
          std::memcpy(&w[off + offsetof(inferd::BlockQ2_K, d)], &d, 2);
          std::memcpy(&w[off + offsetof(inferd::BlockQ2_K, dmin)], &d, 2);
        } else if (type == DType::kIQ4_NL) {
          std::memcpy(&w[off + offsetof(inferd::BlockIQ4_NL, d)], &d, 2);
        } else {
          std::memcpy(&w[off], &d, 2);
          std::memcpy(&w[off + 2], &d, 2);
        }
      }
    }
    const size_t act_row = inferd::dtype_row_bytes(tk->act_type, k);
    std::vector<uint8_t> act(act_row * m);
    for (int64_t t = 0; t < m; ++t) {
      for (auto& v : x) v = nd(rng);
      tk->quantize_act(x.data(), act.data() + t * act_row, k);
    }
    std::vector<float> out_dot(rows * m), out_gemm(rows * m);
    const double t_dot = best_seconds(reps, [&] {
      constexpr int64_t kRowBlock = 32;
      for (int64_t rb = 0; rb < rows; rb += kRowBlock) {
        for (int64_t t = 0; t < m; t += kMaxDotRows) {
          const int nr = static_cast<int>(std::min<int64_t>(kMaxDotRows, m - t));
          float res[kMaxDotRows];
          for (int64_t r = rb; r < std::min(rows, rb + kRowBlock); ++r) {
            tk->dot(k, w.data() + r * w_row, act.data() + t * act_row, act_row, nr, res);
            for (int j = 0; j < nr; ++j) out_dot[(t + j) * rows + r] = res[j];
          }
        }
      }
    });
    const GemmFn fn = gemm_kernel_for(type, inferd::WeightLayout::kRows, best_isa(), order);
    if (fn == nullptr) {
      std::printf("%-5s dot nr=4 %7.2f GMAC/s   gemm: none on this ISA\n", inferd::dtype_name(type),
                  macs / t_dot * 1e-9);
      continue;
    }
    const GemmArgs args{type, k, w.data(), w_row, 0, rows, act.data(), act_row, m, out_gemm.data(), rows, false,
                        nullptr};
    const double t_gemm = best_seconds(reps, [&] { fn(args); });
    int64_t differ = 0;
    for (size_t i = 0; i < out_dot.size(); ++i) differ += std::memcmp(&out_dot[i], &out_gemm[i], 4) != 0;
    std::printf("%-5s dot nr=4 %7.2f GMAC/s   gemm %7.2f GMAC/s   x%.2f", inferd::dtype_name(type), macs / t_dot * 1e-9,
                macs / t_gemm * 1e-9, t_dot / t_gemm);
    const GemmFn fn16 = gemm_kernel_for(type, inferd::WeightLayout::kInterleaved16, best_isa(), order);
    if (fn16 != nullptr && rows % inferd::kInterleaveRows == 0) {
      std::vector<uint8_t> w16(w.size());
      inferd::interleave_groups(type, k, rows / inferd::kInterleaveRows, w.data(), w16.data());
      GemmArgs args16 = args;
      args16.w = w16.data();
      args16.layout = inferd::WeightLayout::kInterleaved16;
      std::vector<float> out16(rows * m);
      args16.out = out16.data();
      const double t16 = best_seconds(reps, [&] { fn16(args16); });
      for (size_t i = 0; i < out_dot.size(); ++i) differ += std::memcmp(&out_dot[i], &out16[i], 4) != 0;
      std::printf("   gemm x16 %7.2f GMAC/s", macs / t16 * 1e-9);
    }
    std::printf("   outputs differing from dot: %lld\n", static_cast<long long>(differ));
  }
  return 0;
}
