// The fused elementwise ops (RMSNorm, residual add + RMSNorm, SiLU-and-mul,
// RoPE) of every ISA variant against double-precision scalar references, plus
// the bfloat16 roundings HF's Llama applies, threads and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "../src/fused_ops_kernel.h"
#include "paternoster/fused_ops.h"
#include "paternoster/thread_pool.h"

#include "bf16_util.h"

namespace paternoster {
namespace {

using test::from_bf16;
using test::to_bf16;
using test::round_bf16;

// A tensor held as float values (exactly representable in the dtype) and
// converted to the kernel's storage on demand.
struct Buf {
  DType dtype;
  std::vector<float> f;
  std::vector<uint16_t> h;

  Buf(DType dt, size_t n) : dtype(dt), f(n), h(n) {}
  void fill_normal(std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    for (auto& v : f) v = normal(rng);
    if (dtype == DType::kBFloat16) {
      for (auto& v : f) v = round_bf16(v);
    }
    sync_in();
  }
  void sync_in() {
    for (size_t i = 0; i < f.size(); ++i) h[i] = to_bf16(f[i]);
  }
  void* data() { return dtype == DType::kFloat32 ? static_cast<void*>(f.data()) : h.data(); }
  // Value i as the kernel left it.
  float at(size_t i) const { return dtype == DType::kFloat32 ? f[i] : from_bf16(h[i]); }
  size_t size() const { return f.size(); }
};

// Allowed error relative to the size of the exact result: float32 sums and
// divisions; bfloat16: up to two roundings of 2^-9 each plus float32 noise.
double tolerance(DType dtype) { return dtype == DType::kFloat32 ? 4e-6 : 1.0 / 128; }

const std::vector<DType> kDtypes = {DType::kFloat32, DType::kBFloat16};
const char* name(DType dtype) { return dtype == DType::kFloat32 ? "float32" : "bfloat16"; }

// ---------------------------------------------------------------- RMSNorm

struct NormCase {
  int64_t t, h;
};
const std::vector<NormCase> kNormCases = {{1, 577}, {37, 577}, {5, 64}, {3, 7}, {2, 576}};

double inv_rms_ref(const Buf& x, int64_t t, int64_t h, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < h; ++i) ss += double{x.at(t * h + i)} * x.at(t * h + i);
  return 1.0 / std::sqrt(ss / h + eps);
}

TEST(RmsNorm, MatchesDoubleReferenceAllVariants) {
  const double eps = 1e-5;
  for (const auto& isa : detail::available_fused_isas()) {
    const auto& k = detail::fused_kernels(isa);
    for (DType dtype : kDtypes) {
      for (const auto& c : kNormCases) {
        SCOPED_TRACE(isa + " " + name(dtype) + " T=" + std::to_string(c.t) +
                     " H=" + std::to_string(c.h));
        std::mt19937 rng(static_cast<uint32_t>(c.t * 1000 + c.h));
        Buf x(dtype, c.t * c.h), w(dtype, c.h), out(dtype, c.t * c.h);
        x.fill_normal(rng, 3.0f);
        w.fill_normal(rng);
        detail::rms_norm(k, out.data(), x.data(), w.data(), c.t, c.h, eps, dtype);
        int64_t exact = 0;
        for (int64_t t = 0; t < c.t; ++t) {
          const double inv = inv_rms_ref(x, t, c.h, eps);
          for (int64_t i = 0; i < c.h; ++i) {
            const size_t j = t * c.h + i;
            const double want = x.at(j) * inv * w.at(i);
            ASSERT_NEAR(out.at(j), want, tolerance(dtype) * std::fabs(want) + 1e-30) << j;
            // HF's roundings: the normalised value in the dtype, then times the weight.
            const float hf = dtype == DType::kFloat32
                                 ? static_cast<float>(x.at(j) * inv) * w.at(i)
                                 : round_bf16(round_bf16(static_cast<float>(x.at(j) * inv)) *
                                              w.at(i));
            exact += out.at(j) == hf;
          }
        }
        if (dtype == DType::kBFloat16) {  // float32 inv_rms vs double: rare ties only
          EXPECT_GE(exact, c.t * c.h * 99 / 100);
        }
      }
    }
  }
}

TEST(RmsNorm, InPlaceAndWithEps) {
  const int64_t t = 4, h = 33;
  std::mt19937 rng(7);
  for (DType dtype : kDtypes) {
    Buf x(dtype, t * h), w(dtype, h), out(dtype, t * h);
    x.fill_normal(rng, 0.01f);  // mean square ~1e-4: eps = 0.1 dominates
    w.fill_normal(rng);
    detail::rms_norm(detail::default_fused_kernels(), out.data(), x.data(), w.data(), t, h, 0.1,
                     dtype);
    Buf y = x;
    rms_norm(y.data(), y.data(), w.data(), t, h, 0.1, dtype);
    for (size_t j = 0; j < out.size(); ++j) {
      EXPECT_EQ(y.at(j), out.at(j));
      const double want = x.at(j) * inv_rms_ref(x, j / h, h, 0.1) * w.at(j % h);
      EXPECT_NEAR(out.at(j), want, tolerance(dtype) * std::fabs(want) + 1e-30);
    }
  }
}

TEST(FusedAddRmsNorm, MatchesReferenceAllVariants) {
  const double eps = 1e-6;
  for (const auto& isa : detail::available_fused_isas()) {
    const auto& k = detail::fused_kernels(isa);
    for (DType dtype : kDtypes) {
      for (const auto& c : kNormCases) {
        SCOPED_TRACE(isa + " " + name(dtype) + " T=" + std::to_string(c.t) +
                     " H=" + std::to_string(c.h));
        std::mt19937 rng(static_cast<uint32_t>(c.t * 77 + c.h));
        Buf x(dtype, c.t * c.h), r(dtype, c.t * c.h), w(dtype, c.h);
        x.fill_normal(rng);
        r.fill_normal(rng, 4.0f);
        w.fill_normal(rng);
        // residual' = x + residual rounded once (as torch's bfloat16 add).
        Buf sum(dtype, x.size());
        for (size_t j = 0; j < sum.size(); ++j) {
          const float s = x.at(j) + r.at(j);
          sum.f[j] = dtype == DType::kFloat32 ? s : round_bf16(s);
        }
        sum.sync_in();
        detail::fused_add_rms_norm(k, x.data(), r.data(), w.data(), c.t, c.h, eps, dtype);
        int64_t exact = 0;
        for (int64_t t = 0; t < c.t; ++t) {
          const double inv = inv_rms_ref(sum, t, c.h, eps);
          for (int64_t i = 0; i < c.h; ++i) {
            const size_t j = t * c.h + i;
            ASSERT_EQ(r.at(j), sum.at(j)) << j;
            const double want = sum.at(j) * inv * w.at(i);
            ASSERT_NEAR(x.at(j), want, tolerance(dtype) * std::fabs(want) + 1e-30) << j;
            // The norm reads the rounded sum, as torch's add-then-norm does.
            exact += x.at(j) == round_bf16(round_bf16(static_cast<float>(sum.at(j) * inv)) *
                                           w.at(i));
          }
        }
        if (dtype == DType::kBFloat16) {
          EXPECT_GE(exact, c.t * c.h * 99 / 100);
        }
      }
    }
  }
}

// ---------------------------------------------------------------- SiLU and mul

TEST(SiluAndMul, MatchesDoubleReferenceAllVariants) {
  for (const auto& isa : detail::available_fused_isas()) {
    const auto& k = detail::fused_kernels(isa);
    for (DType dtype : kDtypes) {
      for (const auto& c : kNormCases) {  // t tokens, intermediate size h
        SCOPED_TRACE(isa + " " + name(dtype) + " T=" + std::to_string(c.t) +
                     " I=" + std::to_string(c.h));
        std::mt19937 rng(static_cast<uint32_t>(c.t * 31 + c.h));
        Buf x(dtype, c.t * 2 * c.h), out(dtype, c.t * c.h);
        x.fill_normal(rng, 4.0f);
        x.f[0] = -100.0f;  // e^100 overflows float32: silu -> -0
        x.f[1] = 95.0f;    // e^-95 underflows: silu -> x
        x.sync_in();
        detail::silu_and_mul(k, out.data(), x.data(), c.t, c.h, dtype);
        for (int64_t t = 0; t < c.t; ++t) {
          for (int64_t i = 0; i < c.h; ++i) {
            const double g = x.at(t * 2 * c.h + i), u = x.at(t * 2 * c.h + c.h + i);
            const double want = g / (1.0 + std::exp(-g)) * u;
            ASSERT_NEAR(out.at(t * c.h + i), want, tolerance(dtype) * std::fabs(want) + 1e-30)
                << t << " " << i << " g=" << g << " u=" << u;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- RoPE

struct RopeCase {
  int64_t t, hq, hkv, d, q_pad, k_pad;
  bool neox;
};

// cos_sin_cache [max_pos, d]: cos of the d/2 angles then their sin, in the dtype.
Buf rope_cache(DType dtype, int64_t max_pos, int64_t d) {
  Buf cache(dtype, max_pos * d);
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / d);
      cache.f[p * d + i] = static_cast<float>(std::cos(angle));
      cache.f[p * d + d / 2 + i] = static_cast<float>(std::sin(angle));
    }
  }
  if (dtype == DType::kBFloat16) {
    for (auto& v : cache.f) v = round_bf16(v);
  }
  cache.sync_in();
  return cache;
}

void check_rope(const detail::FusedKernels& k, DType dtype, const RopeCase& c) {
  const int64_t max_pos = 300;
  std::mt19937 rng(static_cast<uint32_t>(c.t * 13 + c.d + c.neox));
  const int64_t qs = c.hq * c.d + c.q_pad, ks = c.hkv * c.d + c.k_pad;
  Buf q(dtype, c.t * qs), key(dtype, c.t * ks);
  q.fill_normal(rng);
  key.fill_normal(rng);
  const Buf q0 = q, k0 = key;
  Buf cache = rope_cache(dtype, max_pos, c.d);
  std::vector<int64_t> pos(c.t);
  std::uniform_int_distribution<int64_t> any(0, max_pos - 1);
  for (auto& p : pos) p = any(rng);
  if (c.t > 1) pos[1] = 0;
  if (c.t > 2) pos[2] = max_pos - 1;
  detail::rotary_embedding(k, pos.data(), q.data(), key.data(), cache.data(), c.t, c.hq, c.hkv,
                           c.d, qs, ks, max_pos, c.neox, dtype);
  const int64_t half = c.d / 2;
  auto check = [&](const Buf& before, const Buf& after, int64_t heads, int64_t stride) {
    for (int64_t t = 0; t < c.t; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < half; ++i) {
          const size_t ja = t * stride + h * c.d + (c.neox ? i : 2 * i);
          const size_t jb = ja + (c.neox ? half : 1);
          const double cs = cache.at(pos[t] * c.d + i), sn = cache.at(pos[t] * c.d + half + i);
          const double a = before.at(ja), b = before.at(jb);
          const double want_a = a * cs - b * sn, want_b = b * cs + a * sn;
          const double size = std::fabs(a) + std::fabs(b);
          ASSERT_NEAR(after.at(ja), want_a, tolerance(dtype) * size + 1e-30) << t << " " << h;
          ASSERT_NEAR(after.at(jb), want_b, tolerance(dtype) * size + 1e-30) << t << " " << h;
          // HF's q * cos + rotate_half(q) * sin: each product rounded to the dtype.
          const float fa = before.at(ja), fb = before.at(jb);
          const float fc = cache.at(pos[t] * c.d + i), fs = cache.at(pos[t] * c.d + half + i);
          if (dtype == DType::kBFloat16) {
            ASSERT_EQ(after.at(ja), round_bf16(round_bf16(fa * fc) - round_bf16(fb * fs)));
            ASSERT_EQ(after.at(jb), round_bf16(round_bf16(fb * fc) + round_bf16(fa * fs)));
          } else {  // volatile: no fused multiply-add here either
            const volatile float ac = fa * fc, bs = fb * fs, bc = fb * fc, as = fa * fs;
            ASSERT_EQ(after.at(ja), ac - bs);
            ASSERT_EQ(after.at(jb), bc + as);
          }
        }
      }
      // Padding between rows is untouched.
      for (int64_t j = heads * c.d; j < stride; ++j) {
        ASSERT_EQ(after.at(t * stride + j), before.at(t * stride + j));
      }
    }
  };
  check(q0, q, c.hq, qs);
  check(k0, key, c.hkv, ks);
}

TEST(RotaryEmbedding, MatchesDoubleReferenceAllVariants) {
  const std::vector<RopeCase> cases = {
      {1, 9, 3, 64, 0, 0, true},    {37, 9, 3, 64, 6 * 64, 3 * 64, true},
      {37, 4, 1, 18, 0, 5, true},   {5, 2, 2, 128, 0, 0, true},
      {37, 3, 1, 64, 128, 0, false}, {4, 2, 1, 14, 0, 0, false}};
  for (const auto& isa : detail::available_fused_isas()) {
    const auto& k = detail::fused_kernels(isa);
    for (DType dtype : kDtypes) {
      for (const auto& c : cases) {
        SCOPED_TRACE(isa + " " + name(dtype) + " T=" + std::to_string(c.t) +
                     " D=" + std::to_string(c.d) + (c.neox ? " neox" : " gptj"));
        check_rope(k, dtype, c);
      }
    }
  }
}

// ---------------------------------------------------------------- threads

TEST(FusedOps, TwoThreadsGiveTheSameResult) {
  // Big enough for every op to be split over the pool.
  const int64_t t = 1000, h = 577, inter = 601;
  static_assert(2 * 1000 * 577 >= detail::kFusedMinParallelElems, "rms_norm would not split");
  const int64_t hq = 9, hkv = 3, d = 64, max_pos = 512;
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(name(dtype));
    std::mt19937 rng(11);
    Buf x(dtype, t * h), w(dtype, h), r(dtype, t * h), g(dtype, t * 2 * inter);
    Buf q(dtype, t * hq * d), kk(dtype, t * hkv * d);
    for (Buf* b : {&x, &w, &r, &g, &q, &kk}) b->fill_normal(rng);
    Buf cache = rope_cache(dtype, max_pos, d);
    std::vector<int64_t> pos(t);
    for (int64_t i = 0; i < t; ++i) pos[i] = (i * 37) % max_pos;

    auto run = [&](int threads) {
      set_num_threads(threads);
      Buf out(dtype, t * h), xs = x, rs = r, act(dtype, t * inter), qs = q, ks = kk;
      rms_norm(out.data(), x.data(), w.data(), t, h, 1e-5, dtype);
      fused_add_rms_norm(xs.data(), rs.data(), w.data(), t, h, 1e-5, dtype);
      silu_and_mul(act.data(), g.data(), t, inter, dtype);
      rotary_embedding(pos.data(), qs.data(), ks.data(), cache.data(), t, hq, hkv, d, hq * d,
                       hkv * d, max_pos, true, dtype);
      set_num_threads(1);
      return std::vector<Buf>{out, xs, rs, act, qs, ks};
    };
    const auto one = run(1), two = run(2);
    for (size_t b = 0; b < one.size(); ++b) {
      for (size_t j = 0; j < one[b].size(); ++j) ASSERT_EQ(one[b].at(j), two[b].at(j)) << b;
    }
  }
}

// ---------------------------------------------------------------- argument checks

TEST(FusedOps, RejectsBadArguments) {
  std::vector<float> a(64), b(64), w(8);
  std::vector<int64_t> pos = {0, 7};
  const auto f32 = DType::kFloat32;
  EXPECT_THROW(rms_norm(a.data(), b.data(), w.data(), -1, 8, 1e-5, f32), std::invalid_argument);
  EXPECT_THROW(rms_norm(a.data(), b.data(), w.data(), 2, 0, 1e-5, f32), std::invalid_argument);
  EXPECT_THROW(rms_norm(a.data(), b.data(), w.data(), 2, 8, -1.0, f32), std::invalid_argument);
  EXPECT_THROW(rms_norm(a.data(), b.data(), w.data(), 2, 8, NAN, f32), std::invalid_argument);
  EXPECT_THROW(rms_norm(nullptr, b.data(), w.data(), 2, 8, 1e-5, f32), std::invalid_argument);
  EXPECT_THROW(rms_norm(a.data(), b.data(), w.data(), 2, 8, 1e-5, static_cast<DType>(7)),
               std::invalid_argument);
  EXPECT_NO_THROW(rms_norm(nullptr, nullptr, nullptr, 0, 8, 1e-5, f32));
  EXPECT_THROW(fused_add_rms_norm(a.data(), a.data(), w.data(), 2, 8, 1e-5, f32),
               std::invalid_argument);
  EXPECT_THROW(silu_and_mul(a.data() + 4, a.data(), 2, 8, f32), std::invalid_argument);
  EXPECT_THROW(silu_and_mul(a.data(), b.data(), 2, 0, f32), std::invalid_argument);
  EXPECT_NO_THROW(silu_and_mul(a.data() + 32, a.data(), 2, 8, f32));
  // positions past the table, odd head size, rows closer than the heads.
  EXPECT_THROW(rotary_embedding(pos.data(), a.data(), b.data(), w.data(), 2, 1, 1, 4, 4, 4, 7,
                                true, f32),
               std::invalid_argument);
  pos[1] = -1;
  EXPECT_THROW(rotary_embedding(pos.data(), a.data(), b.data(), w.data(), 2, 1, 1, 4, 4, 4, 8,
                                true, f32),
               std::invalid_argument);
  pos[1] = 1;
  EXPECT_THROW(rotary_embedding(pos.data(), a.data(), b.data(), w.data(), 2, 1, 1, 3, 3, 3, 2,
                                true, f32),
               std::invalid_argument);
  EXPECT_THROW(rotary_embedding(pos.data(), a.data(), b.data(), w.data(), 2, 2, 1, 4, 7, 4, 2,
                                true, f32),
               std::invalid_argument);
  EXPECT_NO_THROW(rotary_embedding(pos.data(), a.data(), b.data(), w.data(), 2, 2, 1, 4, 8, 4, 2,
                                   true, f32));
  EXPECT_THROW(detail::fused_kernels("no-such-isa"), std::invalid_argument);
  EXPECT_STREQ(detail::default_fused_kernels().isa, attention_isa());
}

}  // namespace
}  // namespace paternoster
