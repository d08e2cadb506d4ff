// inferd/rope_table.h — the rotary angles of a step's positions as the CPU backend computes them
// (ops::rope_head: theta = pos * base^(-2i/d), by repeated multiplication in float, then std::cos and
// std::sin), for backends that rotate on a device from a table the host computed: the same calls in the
// same order give the same libm results, so the device's RoPE starts from the CPU's angles.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace inferd {

// [positions.size()][head_dim / 2] (cos, sin) pairs. head_dim: positive and even. The angle of pair i is
// freq_scale * theta_i, theta_i divided by factors[i] first where `factors` (head_dim / 2 floats: Llama
// 3.1's rope_freqs) is given, as ops::rope_head computes it.
std::vector<float> rope_table(std::span<const int32_t> positions, int32_t head_dim, float base,
                              float freq_scale = 1.0f, const float* factors = nullptr);

}  // namespace inferd
