// AVX-512 (F, BW, VL, DQ) level; bf16 rounding in integer ops.
#define KOLOS_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"
#define KOLOS_AVX512_HW_BF16 0
#include "avx512_body.h"

namespace kolos::kernels::detail {
const KernelTable& avx512_table() {
  static const KernelTable table = make_avx512_table();
  return table;
}
}  // namespace kolos::kernels::detail
