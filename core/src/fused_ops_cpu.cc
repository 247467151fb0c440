// Fused elementwise ops driver: argument checks, the split of rows over the
// thread pool, and the choice of SIMD variant (the attention kernel's).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_kernel.h"
#include "fused_ops_kernel.h"
#include "paternoster/fused_ops.h"
#include "paternoster/thread_pool.h"

namespace paternoster {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

void require_positive(int64_t v, const char* name) {
  if (v <= 0) fail(std::string(name) + " must be > 0, got " + std::to_string(v));
}
void require_rows(int64_t num_tokens) {
  if (num_tokens < 0) fail("num_tokens must be >= 0, got " + std::to_string(num_tokens));
}
void require_eps(double eps) {
  if (!(eps >= 0.0) || !std::isfinite(eps)) {
    fail("eps must be finite and >= 0, got " + std::to_string(eps));
  }
}

// Work items per thread: a few, so the dynamic schedule evens out.
constexpr int64_t kItemsPerThread = 4;

// fn(t0, t1) over row ranges covering [0, rows), on default_thread_pool()
// when rows * row_elems (elements of the arrays a row reads or writes) is at
// least kFusedMinParallelElems.
template <typename Fn>
void for_rows(int64_t rows, int64_t row_elems, const Fn& fn) {
  ThreadPool& pool = default_thread_pool();
  const int64_t threads = pool.num_threads();
  if (threads <= 1 || rows < 2 || rows * row_elems < detail::kFusedMinParallelElems) {
    fn(int64_t{0}, rows);
    return;
  }
  const int64_t items = std::min(rows, threads * kItemsPerThread);
  pool.parallel_for(items, [&](int64_t i) { fn(rows * i / items, rows * (i + 1) / items); });
}

const detail::FusedKernels* compiled_kernels(const std::string& isa) {
#if defined(PATERNOSTER_HAVE_AVX512)
  if (isa == "avx512") return &detail::avx512::kFusedKernels;
#endif
#if defined(PATERNOSTER_HAVE_AVX2)
  if (isa == "avx2") return &detail::avx2::kFusedKernels;
#endif
  if (isa == "baseline") return &detail::baseline::kFusedKernels;
  return nullptr;
}

}  // namespace

namespace detail {

std::vector<std::string> available_fused_isas() { return available_attention_isas(); }

const FusedKernels& fused_kernels(const std::string& isa) {
  for (const std::string& name : available_fused_isas()) {
    if (name == isa) {
      if (const FusedKernels* k = compiled_kernels(isa)) return *k;
    }
  }
  fail("fused ops ISA variant not available: " + isa);
}

const FusedKernels& default_fused_kernels() {
  static const FusedKernels& chosen = fused_kernels(attention_isa());
  return chosen;
}

void rms_norm(const FusedKernels& k, void* out, const void* x, const void* weight,
              int64_t num_tokens, int64_t hidden_size, double eps, DType dtype) {
  dtype_size(dtype);
  require_rows(num_tokens);
  require_positive(hidden_size, "hidden_size");
  require_eps(eps);
  if (num_tokens == 0) return;
  if (!out || !x || !weight) fail("out, x and weight must not be null");
  const NormArgs args{out, x, nullptr, weight, hidden_size, static_cast<float>(eps), dtype};
  for_rows(num_tokens, 2 * hidden_size,
           [&](int64_t t0, int64_t t1) { k.rms_norm(args, t0, t1); });
}

void fused_add_rms_norm(const FusedKernels& k, void* x, void* residual, const void* weight,
                        int64_t num_tokens, int64_t hidden_size, double eps, DType dtype) {
  dtype_size(dtype);
  require_rows(num_tokens);
  require_positive(hidden_size, "hidden_size");
  require_eps(eps);
  if (num_tokens == 0) return;
  if (!x || !residual || !weight) fail("x, residual and weight must not be null");
  if (x == residual) fail("x and residual must be different arrays");
  const NormArgs args{x, x, residual, weight, hidden_size, static_cast<float>(eps), dtype};
  for_rows(num_tokens, 2 * hidden_size,
           [&](int64_t t0, int64_t t1) { k.fused_add_rms_norm(args, t0, t1); });
}

void silu_and_mul(const FusedKernels& k, void* out, const void* x, int64_t num_tokens,
                  int64_t intermediate_size, DType dtype) {
  const int64_t elem = dtype_size(dtype);
  require_rows(num_tokens);
  require_positive(intermediate_size, "intermediate_size");
  if (num_tokens == 0) return;
  if (!out || !x) fail("out and x must not be null");
  const auto o = reinterpret_cast<uintptr_t>(out), i = reinterpret_cast<uintptr_t>(x);
  const auto out_bytes = static_cast<uintptr_t>(num_tokens * intermediate_size * elem);
  if (o < i + 2 * out_bytes && i < o + out_bytes) fail("out must not overlap x");
  const SiluArgs args{out, x, intermediate_size, dtype};
  for_rows(num_tokens, 3 * intermediate_size,
           [&](int64_t t0, int64_t t1) { k.silu_and_mul(args, t0, t1); });
}

void rotary_embedding(const FusedKernels& k, const int64_t* positions, void* query, void* key,
                      const void* cos_sin_cache, int64_t num_tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_size, int64_t query_stride,
                      int64_t key_stride, int64_t max_positions, bool is_neox, DType dtype) {
  dtype_size(dtype);
  require_rows(num_tokens);
  require_positive(num_heads, "num_heads");
  require_positive(num_kv_heads, "num_kv_heads");
  require_positive(head_size, "head_size");
  require_positive(max_positions, "max_positions");
  if (head_size % 2) fail("head_size must be even, got " + std::to_string(head_size));
  if (query_stride < num_heads * head_size) {
    fail("query_stride (" + std::to_string(query_stride) + ") < num_heads * head_size (" +
         std::to_string(num_heads * head_size) + ")");
  }
  if (key_stride < num_kv_heads * head_size) {
    fail("key_stride (" + std::to_string(key_stride) + ") < num_kv_heads * head_size (" +
         std::to_string(num_kv_heads * head_size) + ")");
  }
  if (num_tokens == 0) return;
  if (!positions || !query || !key || !cos_sin_cache) {
    fail("positions, query, key and cos_sin_cache must not be null");
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (positions[t] < 0 || positions[t] >= max_positions) {
      fail("positions[" + std::to_string(t) + "] = " + std::to_string(positions[t]) +
           " out of range [0, " + std::to_string(max_positions) + ")");
    }
  }
  const RotaryArgs args{positions,    query,        key,        cos_sin_cache,
                        num_heads,    num_kv_heads, head_size,  query_stride,
                        key_stride,   is_neox,      dtype};
  for_rows(num_tokens, (num_heads + num_kv_heads) * head_size,
           [&](int64_t t0, int64_t t1) { k.rotary_embedding(args, t0, t1); });
}

}  // namespace detail

void rms_norm(void* out, const void* x, const void* weight, int64_t num_tokens,
              int64_t hidden_size, double eps, DType dtype) {
  detail::rms_norm(detail::default_fused_kernels(), out, x, weight, num_tokens, hidden_size, eps,
                   dtype);
}

void fused_add_rms_norm(void* x, void* residual, const void* weight, int64_t num_tokens,
                        int64_t hidden_size, double eps, DType dtype) {
  detail::fused_add_rms_norm(detail::default_fused_kernels(), x, residual, weight, num_tokens,
                             hidden_size, eps, dtype);
}

void silu_and_mul(void* out, const void* x, int64_t num_tokens, int64_t intermediate_size,
                  DType dtype) {
  detail::silu_and_mul(detail::default_fused_kernels(), out, x, num_tokens, intermediate_size,
                       dtype);
}

void rotary_embedding(const int64_t* positions, void* query, void* key,
                      const void* cos_sin_cache, int64_t num_tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_size, int64_t query_stride,
                      int64_t key_stride, int64_t max_positions, bool is_neox, DType dtype) {
  detail::rotary_embedding(detail::default_fused_kernels(), positions, query, key, cos_sin_cache,
                           num_tokens, num_heads, num_kv_heads, head_size, query_stride,
                           key_stride, max_positions, is_neox, dtype);
}

}  // namespace paternoster
