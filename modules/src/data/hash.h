// Counter-based randomness for the data sources (internal to modules/data).
//
// Every random choice is a pure function of (seed, counter), so a sample never
// depends on which samples were read before it, on which thread reads it, or
// on the standard library (std::mt19937 streams would be shared state, and
// std::uniform_int_distribution differs between libstdc++ and libc++).
#pragma once

#include <cstdint>

namespace kolos::data::internal {

// SplitMix64's finaliser: a bijection of uint64 with full avalanche.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// One SplitMix64 step from state `x`.
inline uint64_t splitmix64(uint64_t x) { return mix64(x + 0x9e3779b97f4a7c15ULL); }

// A 64-bit hash of two words; order matters (hash_words(a, b) != hash_words(b, a)).
inline uint64_t hash_words(uint64_t a, uint64_t b) { return splitmix64(splitmix64(a) ^ b); }

// A keyed bijection of [0, n), evaluated in O(1) time and memory, stateless and
// therefore thread-safe.
//
// Why not a cached shuffle: a Fisher-Yates permutation of the current epoch
// needs O(n) memory and a mutex, and threads that read on both sides of an
// epoch boundary would rebuild it back and forth. Here a balanced Feistel
// network permutes [0, 4^k) with 4^k the smallest power of four >= n (so at
// most 4n); "cycle walking" re-applies it until the value lands in [0, n).
// That stays a bijection of [0, n): the walk from x follows x's cycle of the
// big permutation, and the next element of that cycle inside [0, n) is
// distinct for distinct x. The expected number of walks is below 4.
class FeistelPermutation {
 public:
  // n >= 1.
  FeistelPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
    half_bits_ = 1;
    while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
    half_mask_ = (uint64_t{1} << half_bits_) - 1;
  }

  uint64_t size() const { return n_; }

  // i in [0, size()); returns the image of i, also in [0, size()).
  uint64_t operator()(uint64_t i) const {
    uint64_t x = i;
    do {
      x = encrypt(x);
    } while (x >= n_);
    return x;
  }

 private:
  // Six rounds: four make a Feistel network a pseudo-random permutation
  // (Luby-Rackoff); two more are cheap insurance for a fast round function.
  static constexpr int kRounds = 6;

  uint64_t encrypt(uint64_t x) const {
    uint64_t left = (x >> half_bits_) & half_mask_;
    uint64_t right = x & half_mask_;
    for (int round = 0; round < kRounds; ++round) {
      const uint64_t f = hash_words(key_ + static_cast<uint64_t>(round), right) & half_mask_;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    return (left << half_bits_) | right;
  }

  uint64_t n_;
  uint64_t key_;
  int half_bits_;
  uint64_t half_mask_;
};

}  // namespace kolos::data::internal
