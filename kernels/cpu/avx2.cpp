// AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; see x86_kernels.inc).
#define INFERD_X86_NS avx2
#define INFERD_X86_VNNI 0
#define INFERD_X86_AVX512 0
#define INFERD_X86_ISA Isa::kAvx2
#include "x86_kernels.inc"
