// The linear-layer kernels of every ISA variant against a double-precision
// reference whose dequantization is written from the GGUF block layouts
// (ggml-common.h): dense float32/bfloat16 and Q8_0/Q4_0/Q4_1 weights, bias,
// float32/bfloat16 outputs, batch invariance (a row's bits alone vs. inside
// any batch, any thread count) and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "paternoster/linear.h"
#include "paternoster/thread_pool.h"

#include "bf16_util.h"

namespace paternoster {
namespace {

using test::from_bf16;
using test::to_bf16;
// IEEE half (normal numbers and zero suffice for the scales drawn here).
uint16_t to_half(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
double from_half(const uint8_t* p) {
  _Float16 h;
  std::memcpy(&h, p, 2);
  return static_cast<double>(h);
}

// A weight of n rows x k values with random blocks (quantized formats draw
// random quants and scales directly: every bit pattern is a valid weight).
struct Weight {
  WeightFormat format;
  int64_t n, k, row_bytes;
  std::vector<uint8_t> bytes;

  Weight(WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng)
      : format(f), n(rows), k(cols), row_bytes(weight_row_bytes(f, cols)),
        bytes(static_cast<size_t>(rows * row_bytes)) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255);
    for (int64_t r = 0; r < n; ++r) {
      uint8_t* row = bytes.data() + r * row_bytes;
      if (f == WeightFormat::kFloat32 || f == WeightFormat::kBFloat16) {
        for (int64_t i = 0; i < k; ++i) {
          const float v = normal(rng);
          if (f == WeightFormat::kFloat32) {
            std::memcpy(row + 4 * i, &v, 4);
          } else {
            const uint16_t h = to_bf16(v);
            std::memcpy(row + 2 * i, &h, 2);
          }
        }
        continue;
      }
      for (int64_t i = 0; i < row_bytes; ++i) row[i] = static_cast<uint8_t>(byte(rng));
      const int64_t block_bytes = row_bytes / (k / kQuantBlock);
      for (int64_t b = 0; b < k / kQuantBlock; ++b) {
        uint8_t* blk = row + b * block_bytes;
        const uint16_t d = to_half(0.01f + 0.05f * std::fabs(normal(rng)));
        std::memcpy(blk, &d, 2);
        if (f == WeightFormat::kQ4_1) {
          const uint16_t m = to_half(-0.2f * std::fabs(normal(rng)));
          std::memcpy(blk + 2, &m, 2);
        }
      }
    }
  }

  // Value (r, i), from the format's block layout.
  double at(int64_t r, int64_t i) const {
    const uint8_t* row = bytes.data() + r * row_bytes;
    switch (format) {
      case WeightFormat::kFloat32: {
        float v;
        std::memcpy(&v, row + 4 * i, 4);
        return v;
      }
      case WeightFormat::kBFloat16: {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        return from_bf16(h);
      }
      case WeightFormat::kQ8_0: {
        const uint8_t* blk = row + (i / 32) * 34;
        return from_half(blk) * static_cast<int8_t>(blk[2 + i % 32]);
      }
      case WeightFormat::kQ4_0:
      case WeightFormat::kQ4_1: {
        const bool with_min = format == WeightFormat::kQ4_1;
        const uint8_t* blk = row + (i / 32) * (with_min ? 20 : 18);
        const uint8_t* qs = blk + (with_min ? 4 : 2);
        const int j = static_cast<int>(i % 32);
        const int nib = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
        return with_min ? from_half(blk) * nib + from_half(blk + 2)
                        : from_half(blk) * (nib - 8);
      }
    }
    return 0.0;
  }
};

struct Case {
  WeightFormat format;
  int64_t k;
};

class LinearTest : public ::testing::TestWithParam<Case> {};

// Every variant, x float32 and bfloat16, out float32 and bfloat16, with bias.
TEST_P(LinearTest, MatchesDoubleReference) {
  const Case c = GetParam();
  std::mt19937 rng(7);
  const int64_t m = 11, n = 37;  // token rows 6 + 4 + 1; column tiles 9 x 4 + 1
  Weight w(c.format, n, c.k, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * c.k)), bias(static_cast<size_t>(n));
  for (auto& v : x) v = from_bf16(to_bf16(normal(rng)));  // exact in both dtypes
  for (auto& v : bias) v = from_bf16(to_bf16(normal(rng)));
  std::vector<uint16_t> xh(x.size()), bh(bias.size());
  for (size_t i = 0; i < x.size(); ++i) xh[i] = to_bf16(x[i]);
  for (size_t i = 0; i < bias.size(); ++i) bh[i] = to_bf16(bias[i]);

  for (const std::string& isa : available_linear_isas()) {
    for (DType xd : {DType::kFloat32, DType::kBFloat16}) {
      std::vector<float> out(static_cast<size_t>(m * n));
      std::vector<uint16_t> out_h(out.size());
      const void* xp = xd == DType::kFloat32 ? static_cast<const void*>(x.data()) : xh.data();
      const void* bp = xd == DType::kFloat32 ? static_cast<const void*>(bias.data()) : bh.data();
      // batch_invariant: the float-activation path for quantized weights too
      // (the 8-bit one is checked against llama.cpp's q8 activations in
      // tests/core/test_linear.py).
      linear_isa_variant(isa.c_str(), out.data(), DType::kFloat32, xp, xd, w.bytes.data(),
                         c.format, bp, m, n, c.k, true);
      linear_isa_variant(isa.c_str(), out_h.data(), DType::kBFloat16, xp, xd, w.bytes.data(),
                         c.format, bp, m, n, c.k, true);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          // The bfloat16 dot-product variant rounds weights to bfloat16 first.
          const bool bf16_weights = isa == "avx512bf16" && xd == DType::kBFloat16 &&
                                    c.format != WeightFormat::kFloat32;
          double ref = bias[static_cast<size_t>(j)], mag = std::fabs(ref);
          for (int64_t t = 0; t < c.k; ++t) {
            const double wv = bf16_weights ? from_bf16(to_bf16(static_cast<float>(w.at(j, t))))
                                           : w.at(j, t);
            const double p = x[static_cast<size_t>(i * c.k + t)] * wv;
            ref += p;
            mag += std::fabs(p);
          }
          const size_t o = static_cast<size_t>(i * n + j);
          // float32 accumulation over k terms: error ~ k * 2^-24 of the magnitude.
          EXPECT_NEAR(out[o], ref, 1e-6 * mag * std::sqrt(static_cast<double>(c.k)) + 1e-6)
              << isa << " (" << i << ", " << j << ")";
          EXPECT_EQ(out_h[o], to_bf16(out[o])) << isa << ": bfloat16 out is the rounded float32";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, LinearTest,
                         ::testing::Values(Case{WeightFormat::kFloat32, 75},
                                           Case{WeightFormat::kFloat32, 576},
                                           Case{WeightFormat::kBFloat16, 13},
                                           Case{WeightFormat::kBFloat16, 576},
                                           Case{WeightFormat::kQ8_0, 96},
                                           Case{WeightFormat::kQ4_0, 64},
                                           Case{WeightFormat::kQ4_1, 576}));

// With batch_invariant, a row's bits do not depend on the batch around it,
// nor on the threads: float32 x (every variant's float32 path) and bfloat16 x
// (the bfloat16 dot-product path where the CPU has it).
TEST(Linear, BatchInvariant) {
  std::mt19937 rng(3);
  const int64_t k = 1536, n = 130, m = 70;
  for (WeightFormat f : {WeightFormat::kBFloat16, WeightFormat::kQ4_1}) {
    Weight w(f, n, k, rng);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(m * k));
    for (auto& v : x) v = normal(rng);
    std::vector<uint16_t> xh(x.size());
    for (size_t i = 0; i < x.size(); ++i) xh[i] = to_bf16(x[i]);
    for (const std::string& isa : available_linear_isas()) {
      for (DType xd : {DType::kFloat32, DType::kBFloat16}) {
        const size_t xsize = xd == DType::kFloat32 ? sizeof(float) : sizeof(uint16_t);
        const char* xp = xd == DType::kFloat32 ? reinterpret_cast<const char*>(x.data())
                                               : reinterpret_cast<const char*>(xh.data());
        std::vector<float> all(static_cast<size_t>(m * n)), one(static_cast<size_t>(n));
        set_num_threads(2);
        linear_isa_variant(isa.c_str(), all.data(), DType::kFloat32, xp, xd, w.bytes.data(), f,
                           nullptr, m, n, k, /*batch_invariant=*/true);
        set_num_threads(1);
        for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{33}, m - 1}) {
          linear_isa_variant(isa.c_str(), one.data(), DType::kFloat32,
                             xp + static_cast<size_t>(i * k) * xsize, xd, w.bytes.data(), f,
                             nullptr, 1, n, k, /*batch_invariant=*/true);
          EXPECT_EQ(0, std::memcmp(one.data(), all.data() + i * n, one.size() * sizeof(float)))
              << isa << " x dtype " << static_cast<int>(xd) << " row " << i;
        }
      }
    }
  }
  set_num_threads(1);
}

TEST(Linear, RejectsBadArguments) {
  float out[4] = {}, x[64] = {};
  uint8_t w[256] = {};
  EXPECT_THROW(weight_row_bytes(WeightFormat::kQ4_0, 48), std::invalid_argument);
  EXPECT_THROW(weight_row_bytes(WeightFormat::kBFloat16, 0), std::invalid_argument);
  EXPECT_THROW(linear(out, DType::kFloat32, x, DType::kFloat32, w, WeightFormat::kQ8_0, nullptr,
                      1, 1, 40),
               std::invalid_argument);
  EXPECT_THROW(linear(out, DType::kFloat32, x, DType::kFloat32, w, WeightFormat::kFloat32,
                      nullptr, -1, 1, 4),
               std::invalid_argument);
  EXPECT_THROW(linear(out, DType::kFloat32, nullptr, DType::kFloat32, w, WeightFormat::kFloat32,
                      nullptr, 1, 1, 4),
               std::invalid_argument);
  EXPECT_THROW(linear_isa_variant("sse9", out, DType::kFloat32, x, DType::kFloat32, w,
                                  WeightFormat::kFloat32, nullptr, 1, 1, 4),
               std::invalid_argument);
  EXPECT_NO_THROW(linear(out, DType::kFloat32, x, DType::kFloat32, w, WeightFormat::kFloat32,
                         nullptr, 0, 1, 4));
}

TEST(Linear, DequantizeRowsMatchesLayout) {
  std::mt19937 rng(5);
  for (WeightFormat f : {WeightFormat::kQ8_0, WeightFormat::kQ4_0, WeightFormat::kQ4_1}) {
    Weight w(f, 3, 64, rng);
    std::vector<float> out(3 * 64);
    dequantize_rows(out.data(), w.bytes.data(), f, 3, 64);
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t i = 0; i < 64; ++i) {
        EXPECT_NEAR(out[static_cast<size_t>(r * 64 + i)], w.at(r, i), 1e-6 * (1 + std::fabs(w.at(r, i))));
      }
    }
  }
}

}  // namespace
}  // namespace paternoster
