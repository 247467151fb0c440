// The linear-layer tile kernels built for the "avx512" ISA level (see
// CMakeLists.txt for its -march). Selected at run time by linear_cpu.cc.
#define PATERNOSTER_ISA_NS avx512
#define PATERNOSTER_SIMD_WIDTH 16
// Quantized-weight calls of up to 64 tokens take the 8-bit activation path
// (linear_kernel.h: LinearKernels::i8_max_tokens).
#define PATERNOSTER_LINEAR_I8_DOT 64
// The 256-value formats take the integer GEMM (i8k_gemm) at every size,
// prefill included: 1.9-2.5x the float path's dequantize-and-FMA (one
// 8192 x 2048 Q4_K / Q6_K / IQ4_XS matrix, 2 threads, 32 and 64 tokens).
#define PATERNOSTER_LINEAR_I8K_DOT (int64_t{1} << 40)
#include "linear_kernel.inc"
