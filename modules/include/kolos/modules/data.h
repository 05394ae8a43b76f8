// Training data: sources of fixed-length token samples.
//
// A sample is seq_len + 1 token ids (inputs are the first seq_len, targets
// the last seq_len). Samples are addressed by a global index, so that any
// data-parallel layout reads the same global batch: step s takes global
// indices [s*B, (s+1)*B) and each dp rank reads its own slice of them.
// Sources are deterministic functions of (seed, index) and are safe to call
// from several threads. Torch-free.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kolos/core/data_source.h"
#include "kolos/core/run_config.h"

namespace kolos::data {

// TokenSource is declared in kolos/core/data_source.h (the engine reads it).

// Synthetic, learnable sequences: each sample is an arithmetic progression
// modulo the vocabulary with a start and stride drawn from (seed, index), so
// a model's loss falls quickly and visibly.
std::unique_ptr<TokenSource> make_synthetic_source(int64_t seq_len, int64_t vocab, uint64_t seed);

// A memory-mapped file of little-endian uint16 or uint32 token ids (nanoGPT's
// .bin layout). Windows of seq_len + 1 tokens at stride seq_len, visited in a
// per-epoch permutation drawn from `seed`. Throws DataError naming the file
// when it is missing, unreadable, not a whole number of tokens, shorter than
// one sample, or when a sample holds a token id >= vocab (naming its offset).
std::unique_ptr<TokenSource> make_token_file_source(const std::string& path,
                                                    const std::string& dtype, int64_t seq_len,
                                                    int64_t vocab, uint64_t seed);

// ---- images (model.name = "vit") -----------------------------------------
// An image sample is seq_len + 1 values too: seq_len = H * W * C float32
// pixels, normalised, in H x W x C order, each as its int32 bit pattern
// sign-extended to int64 (pack_pixel), then the label (0 <= label < classes).
inline int64_t pack_pixel(float value) {
  int32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return static_cast<int64_t>(bits);
}
inline float unpack_pixel(int64_t packed) {
  const int32_t bits = static_cast<int32_t>(packed);
  float value = 0;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// How an image source turns stored uint8 pixels into samples
// ([data] mean, std, crop_pad, flip).
struct ImageTransform {
  double mean = 0.0;  // on pixel / 255
  double std = 1.0;
  int64_t crop_pad = 0;  // > 0: zero-pad each side, crop a random window back
  bool flip = false;     // mirror left-right with probability 1/2
};

// Synthetic labelled images for data.kind = "synthetic" with model.name =
// "vit": each class is a fixed random pattern (from `seed`), each sample
// its class's pattern plus noise, both drawn from (seed, index).
std::unique_ptr<TokenSource> make_synthetic_image_source(int64_t image_size, int64_t channels,
                                                         int64_t classes, uint64_t seed);

// An HDF5 file with datasets `images` (N x H x W x C uint8, H = W =
// image_size, C = channels) and `labels` (N integers in [0, classes)),
// visited in a per-epoch permutation drawn from `seed`; crop and flip drawn
// from (seed, index). Throws DataError naming the file and the dataset or
// key when the file is missing or not HDF5, a dataset is missing or of
// another shape or type, or a label is outside [0, classes).
std::unique_ptr<TokenSource> make_image_file_source(const std::string& path, int64_t image_size,
                                                    int64_t channels, int64_t classes,
                                                    const ImageTransform& transform,
                                                    uint64_t seed);

// ---- diffusion (model.name = "dit") ---------------------------------------
// An image source's samples, each followed by a noise key written twice:
// seq_len = images' seq_len + 2, a sample [pixels, label, key, key]. The key
// is diffusion_key(seed, index), a pure function of the global sample index
// (hence of the step), from which the model draws the sample's timestep,
// noise and class dropout (kolos/modules/dit.h).
int64_t diffusion_key(uint64_t seed, int64_t index);
std::unique_ptr<TokenSource> make_diffusion_source(std::unique_ptr<TokenSource> images,
                                                   uint64_t seed);

// From a run's [data] and [model] sections.
std::unique_ptr<TokenSource> make_source(const RunConfig& config);

// `kolos data prepare`: byte-level tokens (ids 0..255) of the concatenated
// input files written as uint16 to `output` (atomically: temporary file, then
// rename). Returns the number of tokens written. Throws DataError naming the
// input that cannot be read.
int64_t prepare_byte_tokens(const std::vector<std::string>& inputs, const std::string& output);

// `kolos data prepare --images`: an images file for data.kind = "images",
// datasets `images` (N x H x W x C uint8) and `labels` (N int64), written
// atomically like the token file.
struct ImagesPrepared {
  int64_t images = 0, height = 0, width = 0, channels = 0;
  int64_t classes = 0;                   // the largest label + 1
  std::vector<std::string> class_names;  // label i's folder name (folders only)
};

// From a folder holding one subfolder per class: the subfolders, sorted by
// name, are labels 0..K-1, and every file under one (sorted by path, hidden
// files skipped) is a PNG or JPEG image of the same H x W x C, H = W. The
// names are also stored as the `labels` dataset's attribute `class_names`.
// Throws DataError naming the file for a file that is not a readable PNG or
// JPEG, an image of another shape than the first (naming both), a folder
// with no class subfolders or a class subfolder without images.
ImagesPrepared prepare_images_from_folder(const std::string& dir, const std::string& output);

// From NumPy arrays saved with numpy.save: `images` uint8 N x H x W x C or
// N x H x W (C = 1), H = W; `labels` int64, int32 or uint8, N values >= 0.
// Throws DataError naming the file for another dtype or shape, Fortran
// order, a negative label, or labels of another count than the images.
ImagesPrepared prepare_images_from_npy(const std::string& images, const std::string& labels,
                                       const std::string& output);

}  // namespace kolos::data
