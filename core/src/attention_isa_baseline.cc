// The attention tile kernel built for the "baseline" ISA level (see CMakeLists.txt
// for its -march). Selected at run time by attention_cpu.cc.
#define PATERNOSTER_ISA_NS baseline
#define PATERNOSTER_SIMD_WIDTH 4
#include "attention_kernel.inc"
