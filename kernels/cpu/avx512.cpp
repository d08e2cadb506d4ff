// AVX-512 (F/BW/VL/DQ/VNNI) kernels: the shared x86 kernels with VNNI accumulation on 256-bit
// registers (see x86_kernels.inc).
// GCC 12's 512-bit intrinsics pass _mm512_undefined_*() as the unused merge source, which its own
// -Wuninitialized flags once inlined (GCC bug 105593, fixed in GCC 13; see gemm_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define INFERD_X86_NS avx512
#define INFERD_X86_VNNI 1
#define INFERD_X86_AVX512 1
#define INFERD_X86_ISA Isa::kAvx512
#include "x86_kernels.inc"
