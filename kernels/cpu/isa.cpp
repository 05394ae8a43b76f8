// Run-time ISA detection (cpuid + XGETBV) and the KOLOS_CPU_ISA override.
#include "kolos/kernels/isa.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KOLOS_X86 1
#else
#define KOLOS_X86 0
#endif

namespace kolos::kernels {
namespace {

constexpr const char* kNames[] = {"scalar", "avx2", "avx512", "avx512_bf16"};

#if KOLOS_X86
uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

Isa detect() {
#if KOLOS_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Isa::kScalar;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
             f16c = c & (1u << 29);
  if (!(osxsave && avx && fma && f16c)) return Isa::kScalar;
  const uint64_t xcr0 = xgetbv0();
  if ((xcr0 & 0x6) != 0x6) return Isa::kScalar;  // OS saves XMM and YMM state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return Isa::kScalar;
  const bool avx2 = b & (1u << 5);
  if (!avx2) return Isa::kScalar;
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31);
  const bool os_zmm = (xcr0 & 0xE6) == 0xE6;  // + opmask, ZMM0-15 upper, ZMM16-31
  if (!(avx512f && avx512dq && avx512bw && avx512vl && os_zmm)) return Isa::kAvx2;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  const bool bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5));
  return bf16 ? Isa::kAvx512Bf16 : Isa::kAvx512;
#else
  return Isa::kScalar;
#endif
}

std::atomic<int> g_active{-1};
std::once_flag g_env_once;

void init_from_env() {
  const Isa best = detected_isa();
  Isa chosen = best;
  if (const char* env = std::getenv("KOLOS_CPU_ISA"); env != nullptr && *env != '\0') {
    Isa requested;
    try {
      requested = parse_isa(env);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("KOLOS_CPU_ISA: ") + e.what());
    }
    if (static_cast<int>(requested) > static_cast<int>(best)) {
      std::fprintf(stderr,
                   "kolos: KOLOS_CPU_ISA=%s, but this CPU supports at most %s; using %s\n", env,
                   isa_name(best), isa_name(best));
    } else {
      chosen = requested;
    }
  }
  int expected = -1;  // force_isa() before the first kernel call wins
  g_active.compare_exchange_strong(expected, static_cast<int>(chosen));
}

}  // namespace

const char* isa_name(Isa isa) {
  const int i = static_cast<int>(isa);
  return i >= 0 && i < 4 ? kNames[i] : "unknown";
}

Isa parse_isa(const std::string& name) {
  for (int i = 0; i < 4; ++i)
    if (name == kNames[i]) return static_cast<Isa>(i);
  throw std::invalid_argument("unknown CPU ISA level `" + name +
                              "`; valid: scalar, avx2, avx512, avx512_bf16");
}

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa active_isa() {
  int v = g_active.load(std::memory_order_acquire);
  if (v < 0) {
    std::call_once(g_env_once, init_from_env);
    v = g_active.load(std::memory_order_acquire);
  }
  return static_cast<Isa>(v);
}

void force_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_isa()))
    throw std::invalid_argument(std::string("cannot use CPU ISA level ") + isa_name(isa) +
                                ": this CPU supports at most " + isa_name(detected_isa()));
  g_active.store(static_cast<int>(isa), std::memory_order_release);
}

}  // namespace kolos::kernels
