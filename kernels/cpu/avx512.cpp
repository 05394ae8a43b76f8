// AVX-512 (F, BW, VL, DQ) level; bf16 rounding in integer ops.
#define KOLOS_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"
#define KOLOS_AVX512_HW_BF16 0
#define KOLOS_AVX512_TABLE avx512_table
#include "avx512_body.h"
