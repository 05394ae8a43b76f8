// NumPy .npy files (format versions 1.0, 2.0 and 3.0) for `kolos data
// prepare --images X.npy --labels Y.npy` (internal to modules/data).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolos::data::internal {

// One array: its dtype as the header writes it (e.g. "<i8", "|u1"), the
// parsed type and shape, and the element bytes in C order as stored.
struct NpyArray {
  std::string descr;
  char kind = 0;  // 'u' unsigned, 'i' signed, 'f' float, 'b' bool, ...
  int itemsize = 0;
  bool big_endian = false;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  // Element i as an integer, for kind 'u' or 'i' arrays of itemsize 1, 2,
  // 4 or 8 (in the file's byte order, whatever the host's).
  int64_t integer(int64_t i) const;
};

// Reads a whole .npy file. Throws DataError naming `path` for a file that
// cannot be read, is not .npy (no magic string, an unknown version), has a
// header that does not parse, a structured or object dtype, Fortran order,
// or a size that does not match its shape (truncated).
NpyArray read_npy(const std::string& path);

}  // namespace kolos::data::internal
