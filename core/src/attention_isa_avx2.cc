// The attention tile kernel built for the "avx2" ISA level (see CMakeLists.txt
// for its -march). Selected at run time by attention_cpu.cc.
#define PATERNOSTER_ISA_NS avx2
#define PATERNOSTER_SIMD_WIDTH 8
#include "attention_kernel.inc"
