// AVX-512 level with AVX512_BF16: fp32 -> bf16 by vcvtneps2bf16.
#define KOLOS_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c"
#define KOLOS_AVX512_HW_BF16 1
#define KOLOS_AVX512_TABLE avx512_bf16_table
#include "avx512_body.h"
