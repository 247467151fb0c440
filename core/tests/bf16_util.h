// bfloat16 <-> float for the core's tests: round to nearest even (no NaN
// handling: the tests' values are finite).
#pragma once

#include <cstdint>
#include <cstring>

namespace paternoster {
namespace test {

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float round_bf16(float f) { return from_bf16(to_bf16(f)); }

}  // namespace test
}  // namespace paternoster
