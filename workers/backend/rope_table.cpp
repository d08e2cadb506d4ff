#include "inferd/rope_table.h"

#include <cmath>

#include "inferd/status.h"

namespace inferd {

std::vector<float> rope_table(std::span<const int32_t> positions, int32_t head_dim, float base, float freq_scale,
                              const float* factors) {
  INFERD_ASSERT(head_dim > 0 && head_dim % 2 == 0, "rope_table: head_dim must be positive and even");
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(head_dim));
  std::vector<float> table(positions.size() * static_cast<size_t>(head_dim));
  size_t at = 0;
  for (int32_t pos : positions) {
    float theta = static_cast<float>(pos);
    for (int32_t i = 0; i < head_dim / 2; ++i) {
      const float angle = freq_scale * (factors ? theta / factors[i] : theta);
      table[at++] = std::cos(angle);
      table[at++] = std::sin(angle);
      theta *= theta_scale;
    }
  }
  return table;
}

}  // namespace inferd
