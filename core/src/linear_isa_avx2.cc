// The linear-layer tile kernels built for the "avx2" ISA level (see
// CMakeLists.txt for its -march). Selected at run time by linear_cpu.cc.
#define PATERNOSTER_ISA_NS avx2
#define PATERNOSTER_SIMD_WIDTH 8
// Quantized-weight calls of up to 64 tokens take the 8-bit activation path
// (linear_kernel.h: LinearKernels::i8_max_tokens).
#define PATERNOSTER_LINEAR_I8_DOT 64
#include "linear_kernel.inc"
