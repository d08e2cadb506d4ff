// AVX-512 (F/BW/VL/DQ/VNNI) kernels: the shared x86 kernels with VNNI accumulation on 256-bit
// registers (see x86_kernels.inc).
#define INFERD_X86_NS avx512
#define INFERD_X86_VNNI 1
#define INFERD_X86_AVX512 1
#define INFERD_X86_ISA Isa::kAvx512
#include "x86_kernels.inc"
