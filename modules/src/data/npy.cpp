// The .npy reader (see npy.h). The format (numpy/lib/format.py): the magic
// "\x93NUMPY", a major and minor version byte, the header length (2 bytes
// little-endian in version 1, 4 bytes in versions 2 and 3), then the header,
// a Python dict literal such as
//   {'descr': '<i8', 'fortran_order': False, 'shape': (10, 8, 8), }
// padded with spaces to an alignment, then the elements.
#include "npy.h"

#include <cctype>
#include <cstring>
#include <limits>

#include "kolos/core/error.h"
#include "kolos/core/posix_file.h"

namespace kolos::data::internal {
namespace {

// A minimal reader of the header's dict literal: finds a key and reads the
// value after its colon.
class HeaderParser {
 public:
  HeaderParser(std::string path, std::string header)
      : path_(std::move(path)), header_(std::move(header)) {}

  // The position just after `'key':` (quotes either way), or throws.
  size_t value_of(const std::string& key) const {
    for (const char quote : {'\'', '"'}) {
      const std::string quoted = std::string(1, quote) + key + quote;
      size_t at = header_.find(quoted);
      if (at == std::string::npos) continue;
      at = skip_space(at + quoted.size());
      if (at < header_.size() && header_[at] == ':') return skip_space(at + 1);
    }
    throw bad("has no '" + key + "'");
  }

  std::string string_at(size_t at) const {
    if (at >= header_.size() || (header_[at] != '\'' && header_[at] != '"')) {
      throw bad("'descr' is not a simple dtype string (a structured dtype?): " + header_);
    }
    const size_t end = header_.find(header_[at], at + 1);
    if (end == std::string::npos) throw bad("an unterminated string");
    return header_.substr(at + 1, end - at - 1);
  }

  bool bool_at(size_t at) const {
    if (header_.compare(at, 4, "True") == 0) return true;
    if (header_.compare(at, 5, "False") == 0) return false;
    throw bad("'fortran_order' is neither True nor False");
  }

  std::vector<int64_t> tuple_at(size_t at) const {
    if (at >= header_.size() || header_[at] != '(') throw bad("'shape' is not a tuple");
    std::vector<int64_t> shape;
    size_t i = skip_space(at + 1);
    while (i < header_.size() && header_[i] != ')') {
      if (!std::isdigit(static_cast<unsigned char>(header_[i]))) {
        throw bad("'shape' holds something other than non-negative integers");
      }
      int64_t value = 0;
      while (i < header_.size() && std::isdigit(static_cast<unsigned char>(header_[i]))) {
        if (value > (std::numeric_limits<int64_t>::max() - 9) / 10) throw bad("a huge dimension");
        value = value * 10 + (header_[i] - '0');
        ++i;
      }
      // Python 2's numpy wrote dimensions as longs: 10L.
      if (i < header_.size() && header_[i] == 'L') ++i;
      shape.push_back(value);
      i = skip_space(i);
      if (i < header_.size() && header_[i] == ',') i = skip_space(i + 1);
    }
    if (i >= header_.size()) throw bad("'shape' has no closing parenthesis");
    return shape;
  }

  DataError bad(const std::string& what) const {
    return DataError(path_ + ": the .npy header " + what);
  }

 private:
  size_t skip_space(size_t i) const {
    while (i < header_.size() && std::isspace(static_cast<unsigned char>(header_[i]))) ++i;
    return i;
  }

  std::string path_, header_;
};

}  // namespace

int64_t NpyArray::integer(int64_t i) const {
  const uint8_t* p = data.data() + static_cast<size_t>(i) * static_cast<size_t>(itemsize);
  uint64_t bits = 0;
  for (int b = 0; b < itemsize; ++b) {
    const uint8_t byte = big_endian ? p[b] : p[itemsize - 1 - b];
    bits = (bits << 8) | byte;
  }
  if (kind == 'i' && itemsize < 8) {
    const int shift = 64 - 8 * itemsize;
    return static_cast<int64_t>(bits << shift) >> shift;  // sign-extend
  }
  return static_cast<int64_t>(bits);
}

NpyArray read_npy(const std::string& path) {
  std::vector<uint8_t> bytes = posix::read_whole_file(path, ".npy file");
  static const char kMagic[] = "\x93NUMPY";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0) {
    throw DataError(path + ": not a NumPy .npy file (no \\x93NUMPY magic string at the start; "
                    "write it with numpy.save)");
  }
  const int major = bytes[6];
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = bytes[8] | (size_t{bytes[9]} << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw DataError(path + ": the .npy file ends inside its header");
    header_len = bytes[8] | (size_t{bytes[9]} << 8) | (size_t{bytes[10]} << 16) |
                 (size_t{bytes[11]} << 24);
    header_start = 12;
  } else {
    throw DataError(path + ": .npy format version " + std::to_string(major) +
                    " is not known; known: 1, 2 and 3");
  }
  if (bytes.size() < header_start + header_len) {
    throw DataError(path + ": the .npy file ends inside its header (truncated?)");
  }
  const HeaderParser header(
      path, std::string(reinterpret_cast<const char*>(bytes.data() + header_start), header_len));

  NpyArray array;
  array.descr = header.string_at(header.value_of("descr"));
  const std::string& d = array.descr;
  if (d.size() < 3 || (d[0] != '<' && d[0] != '>' && d[0] != '|' && d[0] != '=') ||
      !std::isalpha(static_cast<unsigned char>(d[1]))) {
    throw DataError(path + ": dtype '" + d + "' is not a plain numeric dtype");
  }
  array.kind = d[1];
  try {
    array.itemsize = std::stoi(d.substr(2));
  } catch (const std::exception&) {
    throw DataError(path + ": dtype '" + d + "' is not a plain numeric dtype");
  }
  array.big_endian = d[0] == '>';
  if (array.itemsize < 1) throw DataError(path + ": dtype '" + d + "' has no item size");
  if (header.bool_at(header.value_of("fortran_order"))) {
    throw DataError(path + ": the array is stored in Fortran (column-major) order; save a "
                    "C-ordered array (numpy.ascontiguousarray) instead");
  }
  array.shape = header.tuple_at(header.value_of("shape"));

  // The element bytes must match the shape exactly.
  const size_t offset = header_start + header_len;
  const size_t have = bytes.size() - offset;
  unsigned __int128 need = static_cast<unsigned>(array.itemsize);
  for (const int64_t dim : array.shape) need *= static_cast<uint64_t>(dim);
  if (need != have) {
    std::string shape;
    for (const int64_t dim : array.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(dim);
    throw DataError(detail::concat(path, ": shape (", shape, ") of dtype '", d, "' needs ",
                                   static_cast<uint64_t>(need), " bytes of data, the file has ",
                                   have, need > have ? " (truncated?)" : " (trailing bytes)"));
  }
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(offset), bytes.end());
  return array;
}

}  // namespace kolos::data::internal
