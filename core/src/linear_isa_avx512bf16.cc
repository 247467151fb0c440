// The linear-layer tile kernels for AVX-512 with the BF16 extension (see
// CMakeLists.txt for its flags): the "avx512" kernels plus bfloat16 dot
// products (vdpbf16ps) for bfloat16 inputs. Selected at run time by
// linear_cpu.cc when the CPU has avx512_bf16.
#define PATERNOSTER_ISA_NS avx512bf16
#define PATERNOSTER_SIMD_WIDTH 16
#define PATERNOSTER_LINEAR_BF16_DOT 1
#include "linear_kernel.inc"
