// Image sources (model.name = "vit"): an HDF5 file of uint8 images and
// integer labels, and synthetic labelled images.
//
// Both deliver samples as kolos/modules/data.h describes (normalised
// float32 pixels as int32 bits, then the label), addressed by a global index
// like the token sources: sample i is epoch e = i / N, position p = i % N,
// and reads image perm_e(p) (a FeistelPermutation of [0, N) keyed by
// (seed, e)). Crop offsets and flips are drawn from (seed, i), so every
// data-parallel layout sees the same pixels for the same global index.
//
// The file is read whole at construction (the digits are 0.1 MB; a larger
// set wants a chunked reader); after that sample() reads only immutable
// members and is thread-safe.
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "hash.h"
#include "hdf5_id.h"
#include "kolos/core/error.h"
#include "kolos/modules/data.h"

namespace kolos::data {
namespace {

using internal::Hid;

constexpr uint64_t kShuffleDomain = 0x696d616765736876ULL;  // "imageshv"
constexpr uint64_t kAugmentDomain = 0x696d616765617567ULL;  // "imageaug"
constexpr uint64_t kPatternDomain = 0x696d616765706174ULL;  // "imagepat"

// A uniform double in [0, 1) from a hash.
double unit(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

// Turns stored uint8 images into samples: normalisation, crop, flip.
class ImageSampler {
 public:
  ImageSampler(int64_t size, int64_t channels, const ImageTransform& t, uint64_t seed)
      : size_(size),
        channels_(channels),
        t_(t),
        augment_key_(internal::hash_words(seed, kAugmentDomain)) {}

  // `image`: size x size x channels uint8.
  void fill(const uint8_t* image, int64_t label, int64_t index, int64_t* out) const {
    int64_t dy = 0, dx = 0;
    bool flip = false;
    const uint64_t h = internal::hash_words(augment_key_, static_cast<uint64_t>(index));
    if (t_.crop_pad > 0) {
      const uint64_t span = static_cast<uint64_t>(2 * t_.crop_pad + 1);
      dy = static_cast<int64_t>(internal::splitmix64(h) % span) - t_.crop_pad;
      dx = static_cast<int64_t>(internal::splitmix64(h + 1) % span) - t_.crop_pad;
    }
    if (t_.flip) flip = (internal::splitmix64(h + 2) & 1) != 0;
    const float zero = static_cast<float>((0.0 - t_.mean) / t_.std);
    for (int64_t y = 0; y < size_; ++y) {
      for (int64_t x = 0; x < size_; ++x) {
        const int64_t sy = y + dy;
        const int64_t sx = (flip ? size_ - 1 - x : x) + dx;
        const bool inside = sy >= 0 && sy < size_ && sx >= 0 && sx < size_;
        for (int64_t c = 0; c < channels_; ++c) {
          float v = zero;
          if (inside) {
            const double pixel = image[(sy * size_ + sx) * channels_ + c] / 255.0;
            v = static_cast<float>((pixel - t_.mean) / t_.std);
          }
          out[(y * size_ + x) * channels_ + c] = pack_pixel(v);
        }
      }
    }
    out[size_ * size_ * channels_] = label;
  }

 private:
  int64_t size_, channels_;
  ImageTransform t_;
  uint64_t augment_key_;
};

class ImageFileSource final : public TokenSource {
 public:
  ImageFileSource(std::string path, std::vector<uint8_t> pixels, std::vector<int64_t> labels,
                  int64_t size, int64_t channels, const ImageTransform& t, uint64_t seed)
      : path_(std::move(path)),
        pixels_(std::move(pixels)),
        labels_(std::move(labels)),
        size_(size),
        channels_(channels),
        sampler_(size, channels, t, seed),
        shuffle_key_(internal::hash_words(seed, kShuffleDomain)) {}

  int64_t seq_len() const override { return size_ * size_ * channels_; }
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }

  void sample(int64_t index, int64_t* out) const override {
    if (index < 0) {
      throw DataError(detail::concat("images ", path_, ": sample index ", index, " is negative"));
    }
    const auto n = static_cast<uint64_t>(labels_.size());
    const uint64_t epoch = static_cast<uint64_t>(index) / n;
    const internal::FeistelPermutation perm(n, internal::hash_words(shuffle_key_, epoch));
    const uint64_t image = perm(static_cast<uint64_t>(index) % n);
    sampler_.fill(pixels_.data() + image * static_cast<uint64_t>(seq_len()), labels_[image], index,
                  out);
  }

  std::string describe() const override {
    std::ostringstream out;
    out << "images: " << path_ << ", " << labels_.size() << " images of " << size_ << "x" << size_
        << "x" << channels_;
    return out.str();
  }

 private:
  std::string path_;
  std::vector<uint8_t> pixels_;
  std::vector<int64_t> labels_;
  int64_t size_, channels_;
  ImageSampler sampler_;
  uint64_t shuffle_key_;
};

// Each class: a fixed random uint8 pattern; each sample: its class's
// pattern with noise, the class drawn from (seed, index).
class SyntheticImageSource final : public TokenSource {
 public:
  SyntheticImageSource(int64_t size, int64_t channels, int64_t classes, uint64_t seed)
      : size_(size),
        channels_(channels),
        classes_(classes),
        seed_(seed),
        sampler_(size, channels, ImageTransform{0.5, 0.25, 0, false}, seed) {
    const int64_t pixels = size * size * channels;
    patterns_.resize(static_cast<size_t>(classes * pixels));
    const uint64_t key = internal::hash_words(seed, kPatternDomain);
    for (size_t i = 0; i < patterns_.size(); ++i) {
      patterns_[i] = (internal::hash_words(key, i) & 1) != 0 ? 200 : 55;
    }
  }

  int64_t seq_len() const override { return size_ * size_ * channels_; }

  void sample(int64_t index, int64_t* out) const override {
    if (index < 0) {
      throw DataError(detail::concat("synthetic images: sample index ", index, " is negative"));
    }
    const uint64_t h = internal::hash_words(seed_, static_cast<uint64_t>(index));
    const int64_t label = static_cast<int64_t>(h % static_cast<uint64_t>(classes_));
    const int64_t pixels = seq_len();
    std::vector<uint8_t> image(static_cast<size_t>(pixels));
    for (int64_t i = 0; i < pixels; ++i) {
      const double noise = (unit(internal::hash_words(h, static_cast<uint64_t>(i))) - 0.5) * 100;
      const double v = patterns_[static_cast<size_t>(label * pixels + i)] + noise;
      image[static_cast<size_t>(i)] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
    }
    sampler_.fill(image.data(), label, index, out);
  }

  std::string describe() const override {
    std::ostringstream out;
    out << "synthetic images: " << size_ << "x" << size_ << "x" << channels_ << ", " << classes_
        << " classes";
    return out.str();
  }

 private:
  int64_t size_, channels_, classes_;
  uint64_t seed_;
  ImageSampler sampler_;
  std::vector<uint8_t> patterns_;
};

std::vector<hsize_t> dataset_shape(hid_t dataset) {
  Hid space(H5Dget_space(dataset), &H5Sclose);
  const int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? " x " : "") + std::to_string(dims[i]);
  return out + "]";
}

}  // namespace

std::unique_ptr<TokenSource> make_synthetic_image_source(int64_t image_size, int64_t channels,
                                                         int64_t classes, uint64_t seed) {
  if (image_size < 1 || channels < 1 || classes < 2) {
    throw DataError(detail::concat("synthetic images: image_size ", image_size, ", channels ",
                                   channels, ", classes ", classes, " (need >= 1, >= 1, >= 2)"));
  }
  return std::make_unique<SyntheticImageSource>(image_size, channels, classes, seed);
}

std::unique_ptr<TokenSource> make_image_file_source(const std::string& path, int64_t image_size,
                                                    int64_t channels, int64_t classes,
                                                    const ImageTransform& transform,
                                                    uint64_t seed) {
  const std::string where = "\"" + path + "\"";
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported here, not printed
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    throw DataError(where +
                    ": cannot be opened as an HDF5 file (missing, unreadable or not "
                    "HDF5); an images file has datasets `images` (N x H x W x C uint8) "
                    "and `labels` (N)");
  }
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), &H5Fclose);
  if (!file.ok()) throw DataError(where + ": HDF5 could not open it (damaged?)");
  for (const char* name : {"images", "labels"}) {
    if (H5Lexists(file.get(), name, H5P_DEFAULT) <= 0) {
      throw DataError(detail::concat(where, ": has no dataset `", name,
                                     "`; an images file has datasets `images` (N x H x W x C "
                                     "uint8) and `labels` (N)"));
    }
  }
  Hid images(H5Dopen2(file.get(), "images", H5P_DEFAULT), &H5Dclose);
  Hid labels(H5Dopen2(file.get(), "labels", H5P_DEFAULT), &H5Dclose);
  if (!images.ok() || !labels.ok()) {
    throw DataError(where + ": `images` or `labels` is not a dataset");
  }
  {
    Hid type(H5Dget_type(images.get()), &H5Tclose);
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1 ||
        H5Tget_sign(type.get()) != H5T_SGN_NONE) {
      throw DataError(where + ": dataset `images` must hold uint8 pixels");
    }
    Hid ltype(H5Dget_type(labels.get()), &H5Tclose);
    if (H5Tget_class(ltype.get()) != H5T_INTEGER) {
      throw DataError(where + ": dataset `labels` must hold integers");
    }
  }
  const std::vector<hsize_t> shape = dataset_shape(images.get());
  if (shape.size() != 4 || shape[0] == 0) {
    throw DataError(where + ": dataset `images` has shape " + shape_text(shape) +
                    "; expected N x H x W x C with N >= 1");
  }
  const auto n = static_cast<int64_t>(shape[0]);
  if (static_cast<int64_t>(shape[1]) != image_size ||
      static_cast<int64_t>(shape[2]) != image_size) {
    throw DataError(detail::concat(where, ": dataset `images` holds ", shape[1], "x", shape[2],
                                   " images, but model.image_size = ", image_size));
  }
  if (static_cast<int64_t>(shape[3]) != channels) {
    throw DataError(detail::concat(where, ": dataset `images` holds ", shape[3],
                                   " channels, but model.channels = ", channels));
  }
  const std::vector<hsize_t> lshape = dataset_shape(labels.get());
  if (lshape.size() != 1 || static_cast<int64_t>(lshape[0]) != n) {
    throw DataError(detail::concat(where, ": dataset `labels` has shape ", shape_text(lshape),
                                   "; expected [", n, "] (one per image)"));
  }
  std::vector<uint8_t> pixels(static_cast<size_t>(n * image_size * image_size * channels));
  std::vector<int64_t> label_values(static_cast<size_t>(n));
  if (H5Dread(images.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, pixels.data()) < 0 ||
      H5Dread(labels.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, label_values.data()) <
          0) {
    throw DataError(where + ": reading `images` or `labels` failed (damaged file?)");
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = label_values[static_cast<size_t>(i)];
    if (label < 0 || label >= classes) {
      throw DataError(detail::concat(where, ": dataset `labels`[", i, "] = ", label,
                                     " is outside [0, model.classes = ", classes, ")"));
    }
  }
  return std::make_unique<ImageFileSource>(path, std::move(pixels), std::move(label_values),
                                           image_size, channels, transform, seed);
}

}  // namespace kolos::data
