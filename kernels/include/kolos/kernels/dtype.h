// Element types of the buffers the CPU kernels take.
#pragma once

#include <cstdint>

namespace kolos::kernels {

// kBFloat16 and kFloat16 buffers are uint16_t bit patterns.
enum class DType : uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

const char* dtype_name(DType dtype);
inline int64_t dtype_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

}  // namespace kolos::kernels
