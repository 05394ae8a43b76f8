// Thin, owning wrappers over the HDF5 C API (torch-free).
//
// Every hid_t is owned by an H5Id that closes it with the right H5?close.
// HDF5's automatic error printing is turned off; failures become
// CheckpointError messages that name the file and object and end with the
// innermost HDF5 message. The Debian HDF5 build is not thread-safe: hold
// h5_lock() around every use (the public entry points do).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace kolos::checkpoint::h5 {

std::unique_lock<std::recursive_mutex> h5_lock();

// The innermost message of the current HDF5 error stack ("" when empty).
std::string last_error();
[[noreturn]] void fail(const std::string& what);  // what + ": " + last_error()

class H5Id {
 public:
  H5Id() = default;
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() { reset(); }
  H5Id(H5Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: passes straight to the C API
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && close_ != nullptr) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// Each checks the id and throws CheckpointError("<what>: <hdf5 message>").
H5Id file(hid_t id, const std::string& what);
H5Id dataset(hid_t id, const std::string& what);
H5Id space(hid_t id, const std::string& what);
H5Id type(hid_t id, const std::string& what);
H5Id plist(hid_t id, const std::string& what);
H5Id attribute(hid_t id, const std::string& what);
H5Id group(hid_t id, const std::string& what);

H5Id create_file(const std::string& path);
H5Id open_file_read(const std::string& path);

// The HDF5 columns of the dtype table (kolos/core/dtype.h) for a dtype name:
// the file type, the memory type, and the element size. known_dtype() is
// false for names the table lacks and for dtypes checkpoints do not store;
// the others throw CheckpointError for those.
hid_t file_type(const std::string& dtype);
hid_t memory_type(const std::string& dtype);
int64_t element_size(const std::string& dtype);
bool known_dtype(const std::string& dtype);

// Creates `path` (e.g. "/model/embed.wte.weight"), intermediate groups too.
H5Id create_dataset(hid_t file, const std::string& path, const std::string& dtype,
                    const std::vector<int64_t>& dims, hid_t dcpl = H5P_DEFAULT);
bool exists(hid_t file, const std::string& path);  // every link on the path

// Attributes. Readers bound what they read before allocating (`max_*`).
void write_attr(hid_t obj, const std::string& name, const std::vector<int64_t>& values);
void write_attr(hid_t obj, const std::string& name, int64_t value);
void write_attr(hid_t obj, const std::string& name, const std::string& value);
bool has_attr(hid_t obj, const std::string& name);
std::vector<int64_t> read_attr_ints(hid_t obj, const std::string& name, int64_t max_count,
                                    const std::string& where);
int64_t read_attr_int(hid_t obj, const std::string& name, const std::string& where);
std::string read_attr_string(hid_t obj, const std::string& name, int64_t max_length,
                             const std::string& where);

// A dataset's extents, bounded: rank <= 32, product <= `max_numel`.
std::vector<int64_t> extents(hid_t dataset, int64_t max_numel, const std::string& where);

// Reads a whole dataset of `shape` (its extents) and `dtype` in whole rows
// of dim 0, at most about `max_bytes` at a time (at least one row), and hands
// each block of rows to `consume` in order; a 0-d dataset yields nothing.
void read_rows(hid_t dataset, const std::vector<int64_t>& shape, const std::string& dtype,
               int64_t max_bytes, const std::string& where,
               const std::function<void(const char* data, size_t bytes)>& consume);

// Names of the links in a group, in name order, at most `max_count`.
std::vector<std::string> list_group(hid_t file, const std::string& group, int64_t max_count,
                                    const std::string& where);

}  // namespace kolos::checkpoint::h5
