// Non-x86 builds: the x86 levels are never detected; their tables are the
// scalar one so that dispatch.cpp links unchanged.
#include "kernel_table.h"

namespace kolos::kernels::detail {
const KernelTable& avx2_table() { return scalar_table(); }
const KernelTable& avx512_table() { return scalar_table(); }
const KernelTable& avx512_bf16_table() { return scalar_table(); }
}  // namespace kolos::kernels::detail
