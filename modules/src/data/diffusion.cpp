// The diffusion source (model.name = "dit"): an image source's samples with
// a noise key appended.
//
// A DiT trains on (image, label, timestep, noise); the timestep and the noise
// of a sample are drawn by the model from the sample's key, and the key is a
// pure function of (seed, global sample index) (the index names the step:
// step s reads indices [s*B, (s+1)*B)). So every layout that reads the same
// global batch draws the same timesteps and noise as the serial run, whichever
// rank reads which sample. The key is written twice: once in the model's input
// (the embedding draws x_t from it) and once as the targets' last value (the
// loss draws the same noise from it).
#include <sstream>

#include "hash.h"
#include "kolos/core/error.h"
#include "kolos/modules/data.h"

namespace kolos::data {
namespace {

// Distinguishes the key stream from the image sources' own draws.
constexpr uint64_t kKeyStream = 0x6469742d6e6f6973ULL;  // "dit-nois"

class DiffusionSource final : public TokenSource {
 public:
  DiffusionSource(std::unique_ptr<TokenSource> images, uint64_t seed)
      : images_(std::move(images)), seed_(seed) {}

  int64_t seq_len() const override { return images_->seq_len() + 2; }

  void sample(int64_t index, int64_t* out) const override {
    const int64_t inner = images_->seq_len();  // pixels; out[inner] is the label
    images_->sample(index, out);
    out[inner + 1] = out[inner + 2] = diffusion_key(seed_, index);
  }

  std::string describe() const override {
    return images_->describe() + "; diffusion noise keyed by (seed, sample index)";
  }
  int64_t size() const override { return images_->size(); }

 private:
  std::unique_ptr<TokenSource> images_;
  uint64_t seed_;
};

}  // namespace

int64_t diffusion_key(uint64_t seed, int64_t index) {
  const uint64_t h = internal::hash_words(internal::hash_words(seed, kKeyStream),
                                          static_cast<uint64_t>(index));
  return static_cast<int64_t>(h >> 2);  // non-negative
}

std::unique_ptr<TokenSource> make_diffusion_source(std::unique_ptr<TokenSource> images,
                                                   uint64_t seed) {
  if (!images) throw DataError("diffusion data: no image source");
  return std::make_unique<DiffusionSource>(std::move(images), seed);
}

}  // namespace kolos::data
