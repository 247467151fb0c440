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

// Rows x [M, K] quantized per 256 values (llama.cpp's quantize_row_q8_K, here
// with the symmetric scale max|x| / 127 of quantize_rows_q8 so |xq| <= 127),
// with each run of 32's integer sum, as detail::LinearArgs::x_q8k says.
void quantize_rows_q8k(const void* x, DType dtype, int64_t M, int64_t K, std::vector<int8_t>& q,
                       std::vector<float>& scale, std::vector<int32_t>& bsum,
                       std::vector<int32_t>& bsum16) {
  constexpr int64_t kBlock = 256;
  const int64_t blocks = K / kBlock;
  q.resize(static_cast<size_t>(M * K));
  scale.resize(static_cast<size_t>(M * blocks));
  bsum.resize(static_cast<size_t>(M * K / kQuantBlock));
  bsum16.resize(static_cast<size_t>(M * K / 16));
  float v[kBlock];
  for (int64_t r = 0; r < M * blocks; ++r) {
    const int64_t base = r * kBlock;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t j = 0; j < kBlock; ++j) {
      if (dtype == DType::kFloat32) {
        v[j] = static_cast<const float*>(x)[base + j];
      } else {
        const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(x)[base + j]) << 16;
        std::memcpy(&v[j], &u, sizeof u);
      }
      amax = std::max(amax, std::fabs(v[j]));
      finite = finite && std::isfinite(v[j]);
    }
    const float d = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    for (int64_t run = 0; run < kBlock / kQuantBlock; ++run) {
      int32_t half[2] = {0, 0};
      for (int64_t j = run * kQuantBlock; j < (run + 1) * kQuantBlock; ++j) {
        const int32_t qi = static_cast<int32_t>(std::nearbyint(v[j] * inv));
        q[static_cast<size_t>(base + j)] = static_cast<int8_t>(qi);
        half[(j / 16) % 2] += qi;
      }
      bsum[static_cast<size_t>(base / kQuantBlock + run)] = half[0] + half[1];
      bsum16[static_cast<size_t>(base / 16 + 2 * run)] = half[0];
      bsum16[static_cast<size_t>(base / 16 + 2 * run + 1)] = half[1];
    }
    scale[static_cast<size_t>(r)] = d;
  }
}

void run(const detail::LinearKernels& k, void* out, DType out_dtype, const void* x,
         DType x_dtype, const WeightPart* parts, int64_t num_parts, const void* bias,
         int64_t num_tokens, int64_t in_features, bool batch_invariant) {
  dtype_size(out_dtype);
  dtype_size(x_dtype);
  if (num_tokens < 0) fail("num_tokens must be >= 0, got " + std::to_string(num_tokens));
  if (num_parts < 1 || !parts) fail("num_parts must be >= 1, got " + std::to_string(num_parts));
  int64_t out_features = 0;
  bool any_float = false;
  for (int64_t p = 0; p < num_parts; ++p) {
    if (parts[p].rows <= 0) {
      fail((num_parts > 1 ? "rows of part " + std::to_string(p) : std::string("out_features")) +
           " must be > 0, got " + std::to_string(parts[p].rows));
    }
    weight_row_bytes(parts[p].format, in_features);  // checks format and in_features
    out_features += parts[p].rows;
  }
  if (num_tokens == 0) return;
  if (!out || !x) fail("out, x and weight must not be null");
  for (int64_t p = 0; p < num_parts; ++p) {
    if (!parts[p].data) fail("out, x and weight must not be null");
  }

  thread_local std::vector<float> x_buf, bias_buf, q8_scale, q8_sum, q8k_scale;
  thread_local std::vector<int8_t> q8, q8k;
  thread_local std::vector<int32_t> q8k_bsum, q8k_bsum16;
  // Quantized parts take the 8-bit path within their kernels' token limits:
  // 32-value formats with x per 32 values, 256-value ones per 256 (x_q8k).
  auto i8_part = [&](WeightFormat f) {
    if (batch_invariant || !is_quantized(f)) return false;
    return num_tokens <= (detail::format_block_values(f) > kQuantBlock ? k.i8k_max_tokens
                                                                        : k.i8_max_tokens);
  };
  bool any_q8 = false, any_q8k = false;
  for (int64_t p = 0; p < num_parts; ++p) {
    if (!i8_part(parts[p].format)) continue;
    (detail::format_block_values(parts[p].format) > kQuantBlock ? any_q8k : any_q8) = true;
  }
  if (any_q8) quantize_rows_q8(x, x_dtype, num_tokens, in_features, q8, q8_scale, q8_sum);
  if (any_q8k) quantize_rows_q8k(x, x_dtype, num_tokens, in_features, q8k, q8k_scale, q8k_bsum,
                                 q8k_bsum16);
  // Per part: quantized parts of an 8-bit call take x_q8; else bfloat16 x goes
  // into bfloat16 dot products as is (float32 weights excepted); else float32 x.
  std::vector<detail::LinearArgs> args;
  args.reserve(static_cast<size_t>(num_parts));
  for (int64_t p = 0; p < num_parts; ++p) {
    const bool i8 = i8_part(parts[p].format);
    const bool per256 = i8 && detail::format_block_values(parts[p].format) > kQuantBlock;
    const bool per32 = i8 && !per256;
    const bool dot = !i8 && k.bf16_dot && x_dtype == DType::kBFloat16 &&
                     parts[p].format != WeightFormat::kFloat32;
    any_float = any_float || (!i8 && !dot);
    detail::LinearArgs a{out, out_dtype, nullptr,
                         dot ? static_cast<const uint16_t*>(x) : nullptr,
                         per32 ? q8.data() : nullptr, per32 ? q8_scale.data() : nullptr,
                         per32 ? q8_sum.data() : nullptr, nullptr, parts[p].format,
                         weight_row_bytes(parts[p].format, in_features), nullptr,
                         num_tokens, out_features, in_features};
    if (per256) {
      a.x_q8k = q8k.data();
      a.x_q8k_scale = q8k_scale.data();
      a.x_q8k_bsum = q8k_bsum.data();
      a.x_q8k_bsum16 = q8k_bsum16.data();
    }
    args.push_back(a);
  }
  const float* x_float = any_float ? as_float(x, x_dtype, num_tokens * in_features, x_buf) : nullptr;
  const float* bias_float = bias ? as_float(bias, x_dtype, out_features, bias_buf) : nullptr;
  // Each part's rows start at column `first` of out: its weight base is set
  // `first` rows before its data, so the tiles address row n of the whole.
  int64_t first = 0;
  for (int64_t p = 0; p < num_parts; ++p) {
    detail::LinearArgs& a = args[static_cast<size_t>(p)];
    if (!a.x_bf16 && !a.x_q8 && !a.x_q8k) a.x = x_float;
    a.bias = bias_float;
    a.weight = static_cast<const uint8_t*>(parts[p].data) - first * a.row_bytes;
    first += parts[p].rows;
  }

  // Work items: (part, token block, column chunk); chunks cut each part's
  // tiles in proportion to its share of all tiles.
  struct Item {
    int64_t part, m0, m1, n0, n1;
  };
  const int64_t token_blocks = (num_tokens + kTokenBlock - 1) / kTokenBlock;
  ThreadPool& pool = default_thread_pool();
  const int64_t threads = pool.num_threads();
  const bool parallel =
      threads > 1 && num_tokens * out_features * in_features >= kMinParallelMacs;
  const int64_t want = parallel ? threads * kItemsPerThread : 1;
  const int64_t all_tiles = (out_features + detail::kLinearNR - 1) / detail::kLinearNR;
  std::vector<Item> items;
  first = 0;
  for (int64_t p = 0; p < num_parts; ++p) {
    const int64_t rows = parts[p].rows;
    const int64_t tiles = (rows + detail::kLinearNR - 1) / detail::kLinearNR;
    const int64_t share = std::max<int64_t>(1, want * tiles / std::max<int64_t>(1, all_tiles));
    const int64_t col_chunks = std::max<int64_t>(1, std::min(tiles, share / token_blocks));
    for (int64_t tb = 0; tb < token_blocks; ++tb) {
      const int64_t m0 = tb * kTokenBlock, m1 = std::min(num_tokens, m0 + kTokenBlock);
      for (int64_t c = 0; c < col_chunks; ++c) {
        const int64_t n0 = first + tiles * c / col_chunks * detail::kLinearNR;
        const int64_t n1 = first + std::min(rows, tiles * (c + 1) / col_chunks * detail::kLinearNR);
        if (n0 < n1) items.push_back(Item{p, m0, m1, n0, n1});
      }
    }
    first += rows;
  }
  auto item = [&](int64_t i) {
    thread_local std::vector<float> scratch;  // kLinearNR rows (bf16 rows padded to 32)
    scratch.resize(static_cast<size_t>(detail::kLinearNR * (in_features + 32)));
    const Item& it = items[static_cast<size_t>(i)];
    k.tile(args[static_cast<size_t>(it.part)], it.m0, it.m1, it.n0, it.n1, scratch.data());
  };
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (!parallel) {
    for (int64_t i = 0; i < n_items; ++i) item(i);
  } else {
    pool.parallel_for(n_items, item);
  }
}

void run_one(const detail::LinearKernels& k, void* out, DType out_dtype, const void* x,
             DType x_dtype, const void* weight, WeightFormat format, const void* bias,
             int64_t num_tokens, int64_t out_features, int64_t in_features,
             bool batch_invariant) {
  if (out_features <= 0) fail("out_features must be > 0, got " + std::to_string(out_features));
  const WeightPart part{weight, format, out_features};
  run(k, out, out_dtype, x, x_dtype, &part, 1, bias, num_tokens, in_features, batch_invariant);
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
  run_one(default_kernels(), out, out_dtype, x, x_dtype, weight, format, bias, num_tokens,
          out_features, in_features, batch_invariant);
}

void linear_parts(void* out, DType out_dtype, const void* x, DType x_dtype,
                  const WeightPart* parts, int64_t num_parts, const void* bias,
                  int64_t num_tokens, int64_t in_features, bool batch_invariant) {
  run(default_kernels(), out, out_dtype, x, x_dtype, parts, num_parts, bias, num_tokens,
      in_features, batch_invariant);
}

void linear_isa_variant(const char* isa, void* out, DType out_dtype, const void* x,
                        DType x_dtype, const void* weight, WeightFormat format, const void* bias,
                        int64_t num_tokens, int64_t out_features, int64_t in_features,
                        bool batch_invariant) {
  run_one(kernels_for(isa ? isa : ""), out, out_dtype, x, x_dtype, weight, format, bias,
          num_tokens, out_features, in_features, batch_invariant);
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
