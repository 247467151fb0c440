// The GGUF block-quantized weight formats of the linear kernel: sizes, and a
// scalar decoder of one run of 32 values (the float paths' dequantization).
// Layouts are ggml's (ggml-common.h; the GGUF specification) and are
// restated in paternoster/linear.h. Internal to the core; header-only so each
// ISA variant compiles it under its own -march.
#pragma once

#include <cstdint>
#include <cstring>

#include "paternoster/linear.h"

namespace paternoster {
namespace detail {

constexpr bool is_quantized_format(WeightFormat f) {
  return f != WeightFormat::kFloat32 && f != WeightFormat::kBFloat16;
}

// Values per block: 32, or 256 for the "super-blocks" of the K-quants and IQ4_XS.
constexpr int64_t format_block_values(WeightFormat f) {
  switch (f) {
    case WeightFormat::kQ4_K:
    case WeightFormat::kQ5_K:
    case WeightFormat::kQ6_K:
    case WeightFormat::kIQ4_XS: return 256;
    default: return kQuantBlock;
  }
}

// Bytes per block (0 for the dense formats).
constexpr int64_t format_block_bytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::kQ8_0: return 34;
    case WeightFormat::kQ4_0: return 18;
    case WeightFormat::kQ4_1: return 20;
    case WeightFormat::kQ5_0: return 22;
    case WeightFormat::kQ5_1: return 24;
    case WeightFormat::kIQ4_NL: return 18;
    case WeightFormat::kMXFP4: return 17;
    case WeightFormat::kQ4_K: return 144;
    case WeightFormat::kQ5_K: return 176;
    case WeightFormat::kQ6_K: return 210;
    case WeightFormat::kIQ4_XS: return 136;
    default: return 0;
  }
}

// The 16 values a 4-bit index of IQ4_NL / IQ4_XS stands for (ggml's
// kvalues_iq4nl), and of MXFP4 (its E2M1 values doubled: kvalues_mxfp4; the
// block scale is halved to match).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                           1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

inline float fp16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float f;
  if (exp == 0x1f) {  // infinity or NaN
    const uint32_t u = sign | 0x7f800000u | (man << 13);
    std::memcpy(&f, &u, sizeof f);
  } else if (exp == 0) {  // zero or subnormal: man * 2^-24
    f = static_cast<float>(man) * 5.9604644775390625e-8f;
    if (sign) f = -f;
  } else {
    const uint32_t u = sign | ((exp + 112u) << 23) | (man << 13);
    std::memcpy(&f, &u, sizeof f);
  }
  return f;
}

// MXFP4's E8M0 block scale, halved (ggml's GGML_E8M0_TO_FP32_HALF): 2^(e - 128).
inline float e8m0_half(uint8_t e) {
  const uint32_t u = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Scale and min of sub-block j (0..7) from the 12 packed 6-bit scale bytes of
// a Q4_K / Q5_K block (ggml's get_scale_min_k4).
inline void k4_scale_min(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The 6-bit scale of sub-block j (0..7) of an IQ4_XS block, biased by 32.
inline int iq4xs_scale(const uint8_t* blk, int j) {
  uint16_t high;
  std::memcpy(&high, blk + 2, sizeof high);
  const int low = (blk[4 + j / 2] >> (4 * (j % 2))) & 0xf;
  return (low | (((high >> (2 * j)) & 3) << 4)) - 32;
}

// Values 32 b .. 32 b + 31 of a weight row in quantized format F, into y[32].
// For the K-quants and IQ4_XS, b / 8 names the block and b % 8 the run in it.
template <WeightFormat F>
inline void decode_run32(const uint8_t* row, int64_t b, float* y) {
  constexpr int64_t per_block = format_block_values(F) / kQuantBlock;
  const uint8_t* blk = row + b / per_block * format_block_bytes(F);
  const int s = static_cast<int>(b % per_block);
  if constexpr (F == WeightFormat::kQ8_0) {
    const float d = fp16_at(blk);
    for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
  } else if constexpr (F == WeightFormat::kQ4_0 || F == WeightFormat::kQ4_1 ||
                       F == WeightFormat::kQ5_0 || F == WeightFormat::kQ5_1) {
    // Byte j of qs: element j (low nibble), j + 16 (high); bit j of qh: element j's fifth bit.
    constexpr bool kMin = F == WeightFormat::kQ4_1 || F == WeightFormat::kQ5_1;
    constexpr bool kHigh = F == WeightFormat::kQ5_0 || F == WeightFormat::kQ5_1;
    const float d = fp16_at(blk);
    const float m = kMin ? fp16_at(blk + 2) : 0.0f;
    uint32_t qh = 0;
    if constexpr (kHigh) std::memcpy(&qh, blk + (kMin ? 4 : 2), sizeof qh);
    const uint8_t* qs = blk + (kMin ? 4 : 2) + (kHigh ? 4 : 0);
    const int bias = kMin ? 0 : kHigh ? 16 : 8;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0xf) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = d * static_cast<float>(lo - bias) + m;
      y[j + 16] = d * static_cast<float>(hi - bias) + m;
    }
  } else if constexpr (F == WeightFormat::kIQ4_NL || F == WeightFormat::kIQ4_XS ||
                       F == WeightFormat::kMXFP4) {
    const int8_t* values = F == WeightFormat::kMXFP4 ? kMXFP4Values : kIQ4NLValues;
    float d;
    const uint8_t* qs;
    if constexpr (F == WeightFormat::kMXFP4) {
      d = e8m0_half(blk[0]);
      qs = blk + 1;
    } else if constexpr (F == WeightFormat::kIQ4_NL) {
      d = fp16_at(blk);
      qs = blk + 2;
    } else {
      d = fp16_at(blk) * static_cast<float>(iq4xs_scale(blk, s));
      qs = blk + 8 + 16 * s;
    }
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(values[qs[j] & 0xf]);
      y[j + 16] = d * static_cast<float>(values[qs[j] >> 4]);
    }
  } else if constexpr (F == WeightFormat::kQ4_K || F == WeightFormat::kQ5_K) {
    // {f16 d, dmin; u8 scales[12]; (Q5_K: u8 qh[32];) u8 qs[128]}: runs 2p and
    // 2p + 1 are the low and high nibbles of qs[32p .. 32p + 31], element l in
    // byte l; Q5_K's fifth bit of element l of run s is bit s of qh[l].
    constexpr bool kHigh = F == WeightFormat::kQ5_K;
    int sc, mn;
    k4_scale_min(s, blk + 4, &sc, &mn);
    const float d = fp16_at(blk) * static_cast<float>(sc);
    const float m = fp16_at(blk + 2) * static_cast<float>(mn);
    const uint8_t* qs = blk + (kHigh ? 48 : 16) + 32 * (s / 2);
    for (int l = 0; l < 32; ++l) {
      int q = s % 2 ? qs[l] >> 4 : qs[l] & 0xf;
      if constexpr (kHigh) q |= ((blk[16 + l] >> s) & 1) << 4;
      y[l] = d * static_cast<float>(q) - m;
    }
  } else if constexpr (F == WeightFormat::kQ6_K) {
    // {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: half h = s / 4 of the
    // block uses ql[64h ..], qh[32h ..], scales[8h ..]; run t = s % 4 takes
    // the low (t < 2) or high nibbles of ql[64h + 32(t % 2) + l] and bits
    // 2t, 2t + 1 of qh[32h + l]; value d * scale * (q - 32), the scale
    // scales[8h + 2t + l / 16].
    const int h = s / 4, t = s % 4;
    const uint8_t* ql = blk + 64 * h + 32 * (t % 2);
    const uint8_t* qh = blk + 128 + 32 * h;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * h + 2 * t);
    const float d = fp16_at(blk + 208);
    for (int l = 0; l < 32; ++l) {
      const int low = t < 2 ? ql[l] & 0xf : ql[l] >> 4;
      const int q = (low | (((qh[l] >> (2 * t)) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[l / 16]) * static_cast<float>(q);
    }
  } else {
    static_assert(is_quantized_format(F), "decode_run32 takes quantized formats");
  }
}

}  // namespace detail
}  // namespace paternoster
