// Internal interface between the fused-op driver (fused_ops_cpu.cc: checks,
// threads, choice of variant) and the per-ISA row kernels (fused_ops_isa_*.cc,
// each compiling fused_ops_kernel.inc with its own SIMD width and -march).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "paternoster/attention.h"
#include "paternoster/fused_ops.h"

namespace paternoster {
namespace detail {

// Below this many elements of the arrays a call reads or writes (x and out:
// 2 T H for RMSNorm) it runs on the calling thread alone. Waking a worker
// costs tens of microseconds; measured on a (busy) 2-core x86 with AVX-512, a
// second thread pays off from about 0.5-1M elements (RMSNorm of a ~1k-token
// prefill at H = 576; a batch-64 decode's RMSNorm is 74k).
constexpr int64_t kFusedMinParallelElems = int64_t{1} << 19;

// rms_norm: out = norm(x). fused_add_rms_norm: residual += x, then x =
// norm(residual) (out is x, the in/out rows).
struct NormArgs {
  void* out;
  const void* x;
  void* residual;
  const void* weight;
  int64_t hidden_size;
  float eps;
  DType dtype;
};

struct SiluArgs {
  void* out;
  const void* x;
  int64_t intermediate_size;
  DType dtype;
};

struct RotaryArgs {
  const int64_t* positions;  // checked by the driver
  void* query;
  void* key;
  const void* cos_sin_cache;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_size;
  int64_t query_stride;
  int64_t key_stride;
  bool is_neox;
  DType dtype;
};

// One ISA variant: each function processes rows [t0, t1).
struct FusedKernels {
  const char* isa;
  void (*rms_norm)(const NormArgs&, int64_t t0, int64_t t1);
  void (*fused_add_rms_norm)(const NormArgs&, int64_t t0, int64_t t1);
  void (*silu_and_mul)(const SiluArgs&, int64_t t0, int64_t t1);
  void (*rotary_embedding)(const RotaryArgs&, int64_t t0, int64_t t1);
};

namespace baseline { extern const FusedKernels kFusedKernels; }
namespace avx2 { extern const FusedKernels kFusedKernels; }
namespace avx512 { extern const FusedKernels kFusedKernels; }

// The variants this build and CPU can run, best first: those of the attention
// kernel (available_attention_isas()).
std::vector<std::string> available_fused_isas();
// The variant the public functions use: the one paged_attention runs
// (attention_isa(), which honours $PATERNOSTER_CPU_ISA).
const FusedKernels& default_fused_kernels();
// The variant named `isa` ("avx512", "avx2", "baseline"; see
// available_attention_isas()); std::invalid_argument if unavailable.
const FusedKernels& fused_kernels(const std::string& isa);

// The public functions with an explicit variant (for tests and benchmarks).
void rms_norm(const FusedKernels& k, void* out, const void* x, const void* weight,
              int64_t num_tokens, int64_t hidden_size, double eps, DType dtype);
void fused_add_rms_norm(const FusedKernels& k, void* x, void* residual, const void* weight,
                        int64_t num_tokens, int64_t hidden_size, double eps, DType dtype);
void silu_and_mul(const FusedKernels& k, void* out, const void* x, int64_t num_tokens,
                  int64_t intermediate_size, DType dtype);
void rotary_embedding(const FusedKernels& k, const int64_t* positions, void* query, void* key,
                      const void* cos_sin_cache, int64_t num_tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_size, int64_t query_stride,
                      int64_t key_stride, int64_t max_positions, bool is_neox, DType dtype);

}  // namespace detail
}  // namespace paternoster
