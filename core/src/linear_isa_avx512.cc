// The linear-layer tile kernels built for the "avx512" ISA level (see
// CMakeLists.txt for its -march). Selected at run time by linear_cpu.cc.
#define PATERNOSTER_ISA_NS avx512
#define PATERNOSTER_SIMD_WIDTH 16
#include "linear_kernel.inc"
