// PNG and JPEG decoding for `kolos data prepare --images` (internal to
// modules/data). Torch-free; libpng and libjpeg stay behind this header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolos::data::internal {

// An image as stored in an images file: height x width x channels uint8, row
// by row, channels interleaved.
struct DecodedImage {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

// Which decoder a file's first bytes call for.
enum class ImageFormat { kPng, kJpeg, kOther };
ImageFormat sniff_image_format(const std::vector<uint8_t>& bytes);

// Decodes a PNG or JPEG file held in `bytes` (read from `path`, which the
// errors name). The channels are the file's own: PNG gray 1, gray + alpha 2,
// RGB 3, RGBA 4 (a palette becomes RGB, or RGBA with a transparency chunk;
// bit depths below 8 are expanded, 16 scaled to 8); JPEG grayscale 1,
// YCbCr or RGB 3. Pixel values are the stored ones, with no gamma or colour
// management applied. Throws DataError for a file that is not PNG or JPEG,
// that is damaged or truncated (libjpeg's warnings about corrupt data are
// errors here), a CMYK JPEG, or a format this build was made without.
DecodedImage decode_image(const std::string& path, const std::vector<uint8_t>& bytes);

}  // namespace kolos::data::internal
