// The linear-layer tile kernels for AVX-512 with the BF16 extension (see
// CMakeLists.txt for its flags): the "avx512" kernels plus bfloat16 dot
// products (vdpbf16ps) for bfloat16 inputs. Selected at run time by
// linear_cpu.cc when the CPU has avx512_bf16.
#define PATERNOSTER_ISA_NS avx512bf16
#define PATERNOSTER_SIMD_WIDTH 16
#define PATERNOSTER_LINEAR_BF16_DOT 1
// Quantized-weight calls of up to 8 tokens take the 8-bit activation path
// (linear_kernel.h: LinearKernels::i8_max_tokens).
#define PATERNOSTER_LINEAR_I8_DOT 8
// The 256-value formats take the 8-bit path at every size; calls of this many
// tokens or more the VNNI GEMM (linear_gemm_vnni.inc).
#define PATERNOSTER_LINEAR_I8K_DOT (int64_t{1} << 40)
#define PATERNOSTER_LINEAR_VNNI_GEMM 3
#include "linear_kernel.inc"
