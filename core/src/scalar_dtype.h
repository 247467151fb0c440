// Scalar reads and writes of float32 / bfloat16 arrays for the core's
// non-SIMD loops (moe.cc, ssm_cpu.cc): arithmetic in float32, bfloat16
// rounded to nearest even, NaN kept NaN.
#pragma once

#include <cstdint>
#include <cstring>

#include "paternoster/attention.h"  // DType

namespace paternoster::detail {

// Element i of p as a float.
inline float load_elem(const void* p, int64_t i, DType dt) {
  if (dt == DType::kFloat32) return static_cast<const float*>(p)[i];
  const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// f rounded to dt, as a float (bfloat16: round to nearest even).
inline float round_elem(float f, DType dt) {
  if (dt == DType::kFloat32) return f;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f;  // NaN stays NaN
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

// Element i of p = f rounded to dt (a NaN stored as a quiet NaN).
inline void store_elem(void* p, int64_t i, float f, DType dt) {
  if (dt == DType::kFloat32) {
    static_cast<float*>(p)[i] = f;
    return;
  }
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint16_t b = (u & 0x7fffffffu) > 0x7f800000u
                         ? static_cast<uint16_t>((u >> 16) | 0x40)  // quiet NaN
                         : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  static_cast<uint16_t*>(p)[i] = b;
}

}  // namespace paternoster::detail
