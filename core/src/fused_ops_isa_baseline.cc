// The fused elementwise kernels built for the "baseline" ISA level (see
// CMakeLists.txt for its -march). Selected at run time by fused_ops_cpu.cc.
#define PATERNOSTER_ISA_NS baseline
#define PATERNOSTER_SIMD_WIDTH 4
#include "fused_ops_kernel.inc"
