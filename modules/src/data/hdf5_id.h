// An owned HDF5 identifier (internal to modules/data; the image source and
// the images-file writer).
#pragma once

#include <hdf5.h>

#include <utility>

namespace kolos::data::internal {

// Owns one HDF5 identifier; `close` is its H5?close. close() closes it now
// and reports the result, for writers that must know a close succeeded.
class Hid {
 public:
  Hid(hid_t id, herr_t (*closer)(hid_t)) : id_(id), close_(closer) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() {
    if (id_ >= 0) close_(id_);
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  herr_t close() { return id_ >= 0 ? close_(std::exchange(id_, -1)) : 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

}  // namespace kolos::data::internal
