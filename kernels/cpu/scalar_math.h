// Element conversions in plain C++: the definition every SIMD path matches
// bit for bit (see convert.h for the rules). Private to kernels/cpu.
#pragma once

#include <cstdint>
#include <cstring>

namespace kolos::kernels::detail {

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Round to nearest even; NaN quieted; fp32 subnormals to signed zero (as
// vcvtneps2bf16 does).
inline uint16_t to_bf16(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  if ((u & 0x7F800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float from_bf16(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

// IEEE binary16, round to nearest even (F. Giesen's float_to_half_fast3_rtne),
// NaN quieted keeping the top payload bits, as vcvtps2ph does.
inline uint16_t to_fp16(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7FFFFFFFu;
  uint32_t o;
  if (a >= 0x47800000u) {  // >= 65536: inf, or NaN
    o = a > 0x7F800000u ? (0x7E00u | ((a >> 13) & 0x3FFu)) : 0x7C00u;
  } else if (a < 0x38800000u) {  // below 2^-14: a subnormal half or zero
    // Adding 0.5f aligns the half's subnormal unit (2^-24) with fp32's ulp
    // at 0.5, so the fp32 adder does the rounding.
    const float f = float_of(a) + float_of(126u << 23);
    o = bits_of(f) - (126u << 23);
  } else {
    const uint32_t mant_odd = (a >> 13) & 1u;
    a += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFu + mant_odd;
    o = a >> 13;  // may carry into the exponent: 65520 and up become inf
  }
  return static_cast<uint16_t>(o | sign);
}
inline float from_fp16(uint16_t h) {
  const uint32_t shifted_exp = 0x7C00u << 13;
  uint32_t o = (static_cast<uint32_t>(h) & 0x7FFFu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += static_cast<uint32_t>(127 - 15) << 23;
  if (exp == shifted_exp) {  // inf or NaN
    o += static_cast<uint32_t>(128 - 16) << 23;
    if (o & 0x007FFFFFu) o |= 0x00400000u;  // quiet
  } else if (exp == 0) {  // subnormal: renormalise through the fp32 adder (exact)
    o += 1u << 23;
    o = bits_of(float_of(o) - float_of(113u << 23));
  }
  return float_of(o | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

}  // namespace kolos::kernels::detail
