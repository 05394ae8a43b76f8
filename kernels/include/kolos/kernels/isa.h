// Which SIMD path the CPU kernels run, chosen at run time.
//
// kolos is built for the baseline x86-64 ISA; every SIMD kernel lives in a
// translation unit of its own whose functions carry GCC/Clang target
// attributes, and is only called after cpuid (and XGETBV, for the OS's
// register state) said the running CPU has it. Nothing is compiled with
// -march=native, so one binary runs on any x86-64 CPU and uses the best
// path it finds there.
//
// Levels, lowest first (each includes the previous):
//   scalar       plain C++ (std::fma: bit-identical results to the others)
//   avx2         AVX2 + FMA + F16C
//   avx512       AVX-512 F/BW/VL/DQ (bf16 conversion emulated in integer ops)
//   avx512_bf16  + AVX512_BF16 (vcvtneps2bf16 for fp32 -> bf16)
// Every level computes the same results bit for bit (see docs/kernels.md).
//
// KOLOS_CPU_ISA=scalar|avx2|avx512|avx512_bf16 lowers the level (read once,
// at the first kernel call). A level above what the CPU supports is lowered
// to the supported one, with one warning on stderr; an unknown name throws
// std::invalid_argument at the first kernel call.
#pragma once

#include <string>

namespace kolos::kernels {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

// "scalar", "avx2", "avx512", "avx512_bf16".
const char* isa_name(Isa isa);
// Parses a name as KOLOS_CPU_ISA takes it; throws std::invalid_argument
// naming the valid ones.
Isa parse_isa(const std::string& name);

// The best level the running CPU and OS support (cpuid, computed once).
Isa detected_isa();
// The level the kernels use now: detected_isa() lowered by KOLOS_CPU_ISA,
// or what force_isa() set last. Thread-safe.
Isa active_isa();
// Makes the kernels use `isa` from now on (tests and benchmarks compare
// paths in one process). Throws std::invalid_argument if the CPU lacks it.
void force_isa(Isa isa);

}  // namespace kolos::kernels
