// inferd/rope_table.h — the rotary angles of a step's positions as the CPU backend computes them
// (ops::rope_head: theta = pos * base^(-2i/d), by repeated multiplication in float, then std::cos and
// std::sin), for backends that rotate on a device from a table the host computed: the same calls in the
// same order give the same libm results, so the device's RoPE starts from the CPU's angles.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace inferd {

// [positions.size()][head_dim / 2] (cos, sin) pairs. head_dim: positive and even.
std::vector<float> rope_table(std::span<const int32_t> positions, int32_t head_dim, float base);

}  // namespace inferd
