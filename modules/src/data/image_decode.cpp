// PNG (libpng) and JPEG (libjpeg) decoding from memory; see image_decode.h.
//
// Both libraries report errors by longjmp. Each setjmp sits in a small
// function whose locals are trivially destructible and not modified after
// the setjmp, so a longjmp skips no destructor and reads no indeterminate
// value; the callers own the libraries' state (destroyed by RAII) and turn a
// failed call into a DataError carrying the library's message.
#include "image_decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "kolos/core/error.h"

#if KOLOS_WITH_PNG
#include <png.h>
#endif
#if KOLOS_WITH_JPEG
// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>
#endif

namespace kolos::data::internal {
namespace {

// The library's message, carried out of a longjmp (libjpeg's need at most
// JMSG_LENGTH_MAX = 200 bytes).
struct CodecMessage {
  char text[256] = {0};
};

#if KOLOS_WITH_PNG

struct PngInput {
  const uint8_t* data;
  size_t size;
  size_t offset;
  CodecMessage message;
};

void png_read_memory(png_structp png, png_bytep out, png_size_t n) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(png));
  if (n > in->size - in->offset) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, in->data + in->offset, n);
  in->offset += n;
}

[[noreturn]] void png_on_error(png_structp png, png_const_charp text) {
  auto* in = static_cast<PngInput*>(png_get_error_ptr(png));
  std::snprintf(in->message.text, sizeof in->message.text, "%s", text);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}  // ancillary-chunk trouble: not fatal

// Owns libpng's read state.
class PngReader {
 public:
  explicit PngReader(PngInput* input) {
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, input, png_on_error, png_on_warning);
    if (png_) info_ = png_create_info_struct(png_);
  }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;
  ~PngReader() {
    if (png_) png_destroy_read_struct(&png_, info_ ? &info_ : nullptr, nullptr);
  }
  bool ok() const { return png_ && info_; }
  png_structp png() const { return png_; }
  png_infop info() const { return info_; }

 private:
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};

struct PngShape {
  png_uint_32 height, width;
  int channels;
};

// Reads the header and sets the transforms to 8-bit samples of the file's
// own channels. False on a libpng error (message in the input).
bool png_read_header(png_structp png, png_infop info, PngShape* shape) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  const png_byte color = png_get_color_type(png, info);
  const png_byte depth = png_get_bit_depth(png, info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
  if (depth == 16) png_set_scale_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  shape->height = png_get_image_height(png, info);
  shape->width = png_get_image_width(png, info);
  shape->channels = png_get_channels(png, info);
  return true;
}

bool png_read_pixels(png_structp png, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  return true;
}

DecodedImage decode_png(const std::string& path, const std::vector<uint8_t>& bytes) {
  PngInput input{bytes.data(), bytes.size(), 0, {}};
  PngReader reader(&input);
  if (!reader.ok()) throw DataError(path + ": libpng could not start");
  png_set_read_fn(reader.png(), &input, png_read_memory);
  auto damaged = [&] {
    return DataError(path + ": not a readable PNG image: " + input.message.text);
  };
  PngShape shape{};
  if (!png_read_header(reader.png(), reader.info(), &shape)) throw damaged();
  if (png_get_rowbytes(reader.png(), reader.info()) !=
      static_cast<size_t>(shape.width) * static_cast<size_t>(shape.channels)) {
    throw DataError(path + ": PNG rows are not 8-bit samples after conversion");
  }
  DecodedImage image;
  image.height = shape.height;
  image.width = shape.width;
  image.channels = shape.channels;
  image.pixels.resize(static_cast<size_t>(image.height * image.width * image.channels));
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (int64_t y = 0; y < image.height; ++y) {
    rows[static_cast<size_t>(y)] = image.pixels.data() + y * image.width * image.channels;
  }
  if (!png_read_pixels(reader.png(), rows.data())) throw damaged();
  return image;
}

#endif  // KOLOS_WITH_PNG

#if KOLOS_WITH_JPEG

// libjpeg's error manager, extended with the jump back to our code.
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  CodecMessage message;
};

[[noreturn]] void jpeg_on_error(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, errors->message.text);
  std::longjmp(errors->jump, 1);
}

// Warnings (level -1) report corrupt data, such as a truncated file, after
// which libjpeg goes on with gray pixels: an error here. Trace messages
// (level >= 0) are ignored.
void jpeg_on_message(j_common_ptr info, int level) {
  if (level < 0) jpeg_on_error(info);
}

// Owns libjpeg's decompression state.
class JpegReader {
 public:
  JpegReader() {
    info_.err = jpeg_std_error(&errors_.mgr);
    errors_.mgr.error_exit = jpeg_on_error;
    errors_.mgr.emit_message = jpeg_on_message;
  }
  JpegReader(const JpegReader&) = delete;
  JpegReader& operator=(const JpegReader&) = delete;
  ~JpegReader() {
    if (created_) jpeg_destroy_decompress(&info_);
  }
  jpeg_decompress_struct* info() { return &info_; }
  JpegErrors* errors() { return &errors_; }
  void set_created() { created_ = true; }

 private:
  jpeg_decompress_struct info_{};
  JpegErrors errors_{};
  bool created_ = false;
};

// jpeg_create_decompress can fail too (out of memory).
bool jpeg_create(jpeg_decompress_struct* info, JpegErrors* errors) {
  if (setjmp(errors->jump)) return false;
  jpeg_create_decompress(info);
  return true;
}

// Reads the header and starts decompression to 8-bit gray or RGB. False on
// an error; *cmyk is set for a CMYK or YCCK file (refused, not decoded).
bool jpeg_start(jpeg_decompress_struct* info, JpegErrors* errors, const uint8_t* data, size_t size,
                bool* cmyk) {
  if (setjmp(errors->jump)) return false;
  jpeg_mem_src(info, const_cast<unsigned char*>(data), static_cast<unsigned long>(size));
  jpeg_read_header(info, TRUE);
  if (info->jpeg_color_space == JCS_CMYK || info->jpeg_color_space == JCS_YCCK) {
    *cmyk = true;
    return true;
  }
  info->out_color_space = info->num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  info->dct_method = JDCT_ISLOW;
  jpeg_start_decompress(info);
  return true;
}

bool jpeg_read_rows(jpeg_decompress_struct* info, JpegErrors* errors, uint8_t* pixels,
                    size_t row_bytes) {
  if (setjmp(errors->jump)) return false;
  while (info->output_scanline < info->output_height) {
    JSAMPROW row = pixels + static_cast<size_t>(info->output_scanline) * row_bytes;
    jpeg_read_scanlines(info, &row, 1);
  }
  jpeg_finish_decompress(info);
  return true;
}

DecodedImage decode_jpeg(const std::string& path, const std::vector<uint8_t>& bytes) {
  JpegReader reader;
  auto damaged = [&] {
    return DataError(path + ": not a readable JPEG image: " + reader.errors()->message.text);
  };
  if (!jpeg_create(reader.info(), reader.errors())) throw damaged();
  reader.set_created();
  bool cmyk = false;
  if (!jpeg_start(reader.info(), reader.errors(), bytes.data(), bytes.size(), &cmyk)) {
    throw damaged();
  }
  if (cmyk) {
    throw DataError(path + ": a CMYK JPEG; convert it to RGB or grayscale first");
  }
  DecodedImage image;
  image.height = reader.info()->output_height;
  image.width = reader.info()->output_width;
  image.channels = reader.info()->output_components;
  image.pixels.resize(static_cast<size_t>(image.height * image.width * image.channels));
  if (!jpeg_read_rows(reader.info(), reader.errors(), image.pixels.data(),
                      static_cast<size_t>(image.width * image.channels))) {
    throw damaged();
  }
  return image;
}

#endif  // KOLOS_WITH_JPEG

}  // namespace

ImageFormat sniff_image_format(const std::vector<uint8_t>& bytes) {
  static const uint8_t png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), png, 8) == 0) return ImageFormat::kPng;
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff) {
    return ImageFormat::kJpeg;
  }
  return ImageFormat::kOther;
}

DecodedImage decode_image(const std::string& path, const std::vector<uint8_t>& bytes) {
  switch (sniff_image_format(bytes)) {
    case ImageFormat::kPng:
#if KOLOS_WITH_PNG
      return decode_png(path, bytes);
#else
      throw DataError(path + ": a PNG image, and this kolos was built without libpng; install "
                      "libpng-dev (scripts/install-deps.sh) and rebuild");
#endif
    case ImageFormat::kJpeg:
#if KOLOS_WITH_JPEG
      return decode_jpeg(path, bytes);
#else
      throw DataError(path + ": a JPEG image, and this kolos was built without libjpeg; install "
                      "libjpeg-dev (scripts/install-deps.sh) and rebuild");
#endif
    case ImageFormat::kOther:
      break;
  }
  throw DataError(path + ": not a PNG or JPEG image (" +
                  (bytes.empty() ? std::string("an empty file")
                                 : "begins with bytes that are neither format's signature") +
                  ")");
}

}  // namespace kolos::data::internal
