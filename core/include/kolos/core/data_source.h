// TokenSource: the engine's view of training data (implementations live in
// modules/, see kolos/modules/data.h).
//
// A sample is seq_len + 1 token ids (inputs are the first seq_len, targets
// the last seq_len). Samples are addressed by a global index, so that any
// data-parallel layout reads the same global batch: step s takes global
// indices [s*B, (s+1)*B) and each dp rank reads its own slice of them.
// Sources are deterministic functions of (seed, index) and are safe to call
// from several threads. Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace kolos::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t seq_len() const = 0;
  // Fills out[0 .. seq_len] (seq_len + 1 ids, each < vocab) with sample `index`
  // (any index >= 0; sources wrap around, reshuffling per epoch).
  virtual void sample(int64_t index, int64_t* out) const = 0;
  // One line for logs: kind, path, tokens, samples per epoch.
  virtual std::string describe() const = 0;
  // Samples per epoch (each read once in indices [0, size())); 0 when the
  // source has no epochs (synthetic data).
  virtual int64_t size() const { return 0; }
};

}  // namespace kolos::data
