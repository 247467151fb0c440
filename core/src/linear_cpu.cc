// Linear-layer driver: argument checks, float32 copies of x and bias, the
// split of the output over the thread pool, and the choice of SIMD variant
// (the attention kernel's, so $PATERNOSTER_CPU_ISA applies here too).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_kernel.h"
#include "linear_kernel.h"
#include "paternoster/linear.h"
#include "paternoster/thread_pool.h"
#include "quant_formats.h"

namespace paternoster {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// Token rows per work item: x rows of one item stay in L2 while every weight
// tile of the item passes over them.
constexpr int64_t kTokenBlock = 64;
// Below this many multiply-adds a call runs on the calling thread alone
// (waking a worker costs tens of microseconds; a 1M-MAC bfloat16 GEMV reads
// 2 MB of weights, ~40 us on one core of the 2-core EPYC this was tuned on).
constexpr int64_t kMinParallelMacs = int64_t{1} << 17;
// Work items per thread, so the dynamic schedule evens out.
constexpr int64_t kItemsPerThread = 4;

// The avx512 variant plus bfloat16 dot products, where the CPU has them.
bool cpu_has_avx512_bf16() {
#if defined(PATERNOSTER_HAVE_AVX512_BF16)
  __builtin_cpu_init();
  // Every CPU with AVX-512 BF16 has VNNI too; checked all the same, as the
  // variant's 8-bit path uses it.
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

const detail::LinearKernels* compiled_kernels(const std::string& isa) {
#if defined(PATERNOSTER_HAVE_AVX512_BF16)
  if (isa == "avx512bf16" && cpu_has_avx512_bf16()) return &detail::avx512bf16::kLinearKernels;
#endif
#if defined(PATERNOSTER_HAVE_AVX512)
  if (isa == "avx512") return &detail::avx512::kLinearKernels;
#endif
#if defined(PATERNOSTER_HAVE_AVX2)
  if (isa == "avx2") return &detail::avx2::kLinearKernels;
#endif
  if (isa == "baseline") return &detail::baseline::kLinearKernels;
  return nullptr;
}

// Variant names this build and CPU can run, best first: "avx512bf16" ahead
// of the attention kernel's variants when the CPU has AVX-512 BF16.
std::vector<std::string> linear_isas() {
  std::vector<std::string> names;
  const std::vector<std::string> attention = detail::available_attention_isas();
  const bool avx512 = std::find(attention.begin(), attention.end(), "avx512") != attention.end();
  if (avx512 && compiled_kernels("avx512bf16")) names.emplace_back("avx512bf16");
  for (const std::string& n : attention) {
    if (compiled_kernels(n)) names.push_back(n);
  }
  return names;
}

const detail::LinearKernels& kernels_for(const std::string& isa) {
  for (const std::string& name : linear_isas()) {
    if (name == isa) return *compiled_kernels(isa);
  }
  fail("linear ISA variant not available: " + isa);
}

// The attention kernel's variant ($PATERNOSTER_CPU_ISA applies), upgraded to
// avx512bf16 where the CPU has it and the attention kernel runs avx512.
const detail::LinearKernels& default_kernels() {
  static const detail::LinearKernels& chosen = [] () -> const detail::LinearKernels& {
    const std::string isa = attention_isa();
    if (isa == "avx512" && compiled_kernels("avx512bf16")) return kernels_for("avx512bf16");
    return kernels_for(isa);
  }();
  return chosen;
}

bool is_quantized(WeightFormat f) { return detail::is_quantized_format(f); }

bool is_known(WeightFormat f) {
  return f == WeightFormat::kFloat32 || f == WeightFormat::kBFloat16 ||
         detail::format_block_bytes(f) > 0;
}

// float32 copy of rows x [n, k] in `dtype` (bfloat16 widens exactly).
const float* as_float(const void* x, DType dtype, int64_t count, std::vector<float>& buf) {
  if (dtype == DType::kFloat32) return static_cast<const float*>(x);
  buf.resize(static_cast<size_t>(count));
  const uint16_t* src = static_cast<const uint16_t*>(x);
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(&buf[static_cast<size_t>(i)], &u, sizeof u);
  }
  return buf.data();
}

// Rows x [M, K] in `dtype` quantized to 8 bits per block of 32 as llama.cpp
// quantizes activations (quantize_row_q8_1: scale max|x| / 127, values
// rounded to nearest, ties to even), with the scales and sums laid out as
// detail::LinearArgs::x_q8 says.
void quantize_rows_q8(const void* x, DType dtype, int64_t M, int64_t K, std::vector<int8_t>& q,
                      std::vector<float>& scale, std::vector<float>& sum) {
  const int64_t blocks = K / kQuantBlock;
  q.resize(static_cast<size_t>(M * K));
  scale.resize(static_cast<size_t>(M * blocks * 8));
  sum.assign(static_cast<size_t>(M * blocks * 8), 0.0f);
  float v[kQuantBlock];
  for (int64_t r = 0; r < M * blocks; ++r) {
    const int64_t base = r * kQuantBlock;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t j = 0; j < kQuantBlock; ++j) {
      if (dtype == DType::kFloat32) {
        v[j] = static_cast<const float*>(x)[base + j];
      } else {
        const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(x)[base + j]) << 16;
        std::memcpy(&v[j], &u, sizeof u);
      }
      amax = std::max(amax, std::fabs(v[j]));
      finite = finite && std::isfinite(v[j]);
    }
    // A NaN or infinity in the block makes its scale NaN, so the outputs it
    // reaches are not finite, as in the float path, rather than a rounding.
    const float d = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    int32_t total = 0;
    for (int64_t j = 0; j < kQuantBlock; ++j) {
      const int32_t qi = static_cast<int32_t>(std::nearbyint(v[j] * inv));
      q[static_cast<size_t>(base + j)] = static_cast<int8_t>(qi);
      total += qi;
    }
    std::fill_n(scale.begin() + r * 8, 8, d);
    sum[static_cast<size_t>(r * 8)] = d * static_cast<float>(total);
  }
}

void run(const detail::LinearKernels& k, void* out, DType out_dtype, const void* x,
         DType x_dtype, const void* weight, WeightFormat format, const void* bias,
         int64_t num_tokens, int64_t out_features, int64_t in_features, bool batch_invariant) {
  dtype_size(out_dtype);
  dtype_size(x_dtype);
  if (num_tokens < 0) fail("num_tokens must be >= 0, got " + std::to_string(num_tokens));
  if (out_features <= 0) fail("out_features must be > 0, got " + std::to_string(out_features));
  const int64_t row_bytes = weight_row_bytes(format, in_features);
  if (num_tokens == 0) return;
  if (!out || !x || !weight) fail("out, x and weight must not be null");

  thread_local std::vector<float> x_buf, bias_buf, q8_scale, q8_sum;
  thread_local std::vector<int8_t> q8;
  const bool i8 = is_quantized(format) && !batch_invariant && num_tokens <= k.i8_max_tokens;
  if (i8) quantize_rows_q8(x, x_dtype, num_tokens, in_features, q8, q8_scale, q8_sum);
  // bfloat16 x into bfloat16 dot products as is (float32 weights excepted).
  const bool dot = !i8 && k.bf16_dot && x_dtype == DType::kBFloat16 &&
                   format != WeightFormat::kFloat32;
  detail::LinearArgs args{out, out_dtype,
                          dot || i8 ? nullptr : as_float(x, x_dtype, num_tokens * in_features, x_buf),
                          dot ? static_cast<const uint16_t*>(x) : nullptr,
                          i8 ? q8.data() : nullptr,
                          i8 ? q8_scale.data() : nullptr,
                          i8 ? q8_sum.data() : nullptr,
                          static_cast<const uint8_t*>(weight), format, row_bytes,
                          bias ? as_float(bias, x_dtype, out_features, bias_buf) : nullptr,
                          num_tokens, out_features, in_features};

  const int64_t token_blocks = (num_tokens + kTokenBlock - 1) / kTokenBlock;
  const int64_t tiles = (out_features + detail::kLinearNR - 1) / detail::kLinearNR;
  ThreadPool& pool = default_thread_pool();
  const int64_t threads = pool.num_threads();
  const bool parallel =
      threads > 1 && num_tokens * out_features * in_features >= kMinParallelMacs;
  const int64_t want = parallel ? threads * kItemsPerThread : 1;
  const int64_t col_chunks = std::max<int64_t>(1, std::min(tiles, want / token_blocks));
  const int64_t items = token_blocks * col_chunks;
  auto item = [&](int64_t i) {
    thread_local std::vector<float> scratch;  // kLinearNR rows (bf16 rows padded to 32)
    scratch.resize(static_cast<size_t>(detail::kLinearNR * (in_features + 32)));
    const int64_t tb = i / col_chunks, c = i % col_chunks;
    const int64_t m0 = tb * kTokenBlock, m1 = std::min(num_tokens, m0 + kTokenBlock);
    const int64_t n0 = tiles * c / col_chunks * detail::kLinearNR;
    const int64_t n1 = std::min(out_features, tiles * (c + 1) / col_chunks * detail::kLinearNR);
    k.tile(args, m0, m1, n0, n1, scratch.data());
  };
  if (!parallel) {
    for (int64_t i = 0; i < items; ++i) item(i);
  } else {
    pool.parallel_for(items, item);
  }
}

}  // namespace

int64_t weight_row_bytes(WeightFormat format, int64_t in_features) {
  if (!is_known(format)) fail("unknown weight format " + std::to_string(static_cast<int>(format)));
  if (in_features <= 0) fail("in_features must be > 0, got " + std::to_string(in_features));
  if (format == WeightFormat::kFloat32) return 4 * in_features;
  if (format == WeightFormat::kBFloat16) return 2 * in_features;
  const int64_t block = detail::format_block_values(format);
  if (in_features % block) {
    fail("in_features must be a multiple of " + std::to_string(block) + " for weight format " +
         std::to_string(static_cast<int>(format)) + ", got " + std::to_string(in_features));
  }
  return in_features / block * detail::format_block_bytes(format);
}

void linear(void* out, DType out_dtype, const void* x, DType x_dtype, const void* weight,
            WeightFormat format, const void* bias, int64_t num_tokens, int64_t out_features,
            int64_t in_features, bool batch_invariant) {
  run(default_kernels(), out, out_dtype, x, x_dtype, weight, format, bias, num_tokens,
      out_features, in_features, batch_invariant);
}

void linear_isa_variant(const char* isa, void* out, DType out_dtype, const void* x,
                        DType x_dtype, const void* weight, WeightFormat format, const void* bias,
                        int64_t num_tokens, int64_t out_features, int64_t in_features,
                        bool batch_invariant) {
  run(kernels_for(isa ? isa : ""), out, out_dtype, x, x_dtype, weight, format, bias, num_tokens,
      out_features, in_features, batch_invariant);
}

void dequantize_rows(float* out, const void* weight, WeightFormat format, int64_t num_rows,
                     int64_t in_features) {
  const int64_t row_bytes = weight_row_bytes(format, in_features);
  if (num_rows < 0) fail("num_rows must be >= 0, got " + std::to_string(num_rows));
  if (num_rows == 0) return;
  if (!out || !weight) fail("out and weight must not be null");
  const auto& k = default_kernels();
  const uint8_t* w = static_cast<const uint8_t*>(weight);
  for (int64_t r = 0; r < num_rows; ++r) {
    k.dequantize_row(w + r * row_bytes, format, in_features, out + r * in_features);
  }
}

std::vector<std::string> available_linear_isas() { return linear_isas(); }

const char* linear_isa() { return default_kernels().isa; }

}  // namespace paternoster
