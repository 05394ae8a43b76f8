// AVX-512 level with AVX512_BF16: fp32 -> bf16 by vcvtneps2bf16.
#define KOLOS_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c"
#define KOLOS_AVX512_HW_BF16 1
#include "avx512_body.h"

namespace kolos::kernels::detail {
const KernelTable& avx512_bf16_table() {
  static const KernelTable table = make_avx512_table();
  return table;
}
}  // namespace kolos::kernels::detail
