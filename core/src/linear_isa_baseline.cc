// The linear-layer tile kernels built for the "baseline" ISA level (see
// CMakeLists.txt for its -march). Selected at run time by linear_cpu.cc.
#define PATERNOSTER_ISA_NS baseline
#define PATERNOSTER_SIMD_WIDTH 4
#include "linear_kernel.inc"
