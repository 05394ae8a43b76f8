// The synthetic source: arithmetic progressions modulo the vocabulary.
//
// Sample `index` starts at s and steps by d, both drawn from hash(seed, index):
// token i = (s + i*d) mod vocab. A model that has seen a couple of tokens can
// predict the rest, so the loss falls quickly and visibly, which is what a
// smoke test of a parallel layout needs.
#include <array>
#include <sstream>

#include "hash.h"
#include "kolos/core/error.h"
#include "kolos/modules/data.h"

namespace kolos::data {
namespace {

// Small strides keep the task easy; 1 and 2 alone would make it trivial.
constexpr std::array<int64_t, 4> kStrides = {1, 2, 3, 5};

class SyntheticSource final : public TokenSource {
 public:
  SyntheticSource(int64_t seq_len, int64_t vocab, uint64_t seed)
      : seq_len_(seq_len), vocab_(vocab), seed_(seed) {}

  int64_t seq_len() const override { return seq_len_; }

  // Thread-safe: reads only immutable members.
  void sample(int64_t index, int64_t* out) const override {
    if (index < 0) {
      throw DataError(detail::concat("synthetic data: sample index ", index,
                                     " is negative; indices start at 0"));
    }
    const uint64_t h = internal::hash_words(seed_, static_cast<uint64_t>(index));
    const auto vocab = static_cast<uint64_t>(vocab_);
    const auto start = static_cast<int64_t>(h % vocab);
    const int64_t stride = kStrides[internal::splitmix64(h) % kStrides.size()];
    int64_t token = start;
    for (int64_t i = 0; i <= seq_len_; ++i) {
      out[i] = token;
      token = (token + stride) % vocab_;  // stays below vocab, never overflows
    }
  }

  std::string describe() const override {
    std::ostringstream out;
    out << "synthetic: arithmetic sequences, vocab " << vocab_;
    return out.str();
  }

 private:
  int64_t seq_len_;
  int64_t vocab_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<TokenSource> make_synthetic_source(int64_t seq_len, int64_t vocab, uint64_t seed) {
  if (seq_len < 1) {
    throw DataError(detail::concat("synthetic data: seq_len is ", seq_len, ", needs at least 1"));
  }
  if (vocab < 1) {
    throw DataError(detail::concat("synthetic data: vocab is ", vocab, ", needs at least 1"));
  }
  return std::make_unique<SyntheticSource>(seq_len, vocab, seed);
}

}  // namespace kolos::data
