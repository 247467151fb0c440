// The attention tile kernel built for the "avx512" ISA level (see CMakeLists.txt
// for its -march). Selected at run time by attention_cpu.cc.
#define PATERNOSTER_ISA_NS avx512
#define PATERNOSTER_SIMD_WIDTH 16
#include "attention_kernel.inc"
