#include "h5.h"

#include <algorithm>

#include "kolos/checkpoint/error.h"
#include "kolos/core/dtype.h"

namespace kolos::checkpoint::h5 {
namespace {

herr_t take_innermost(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err->desc != nullptr) *out = err->desc;  // walking upward: 0 is innermost
  return 0;
}

H5Id checked(hid_t id, herr_t (*close)(hid_t), const std::string& what) {
  if (id < 0) fail(what);
  return H5Id(id, close);
}

}  // namespace

std::unique_lock<std::recursive_mutex> h5_lock() {
  static std::recursive_mutex mutex;
  std::unique_lock<std::recursive_mutex> lock(mutex);
  static bool quiet = [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)quiet;
  return lock;
}

std::string last_error() {
  std::string message;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost, &message);
  H5Eclear2(H5E_DEFAULT);
  return message;
}

void fail(const std::string& what) {
  const std::string detail = last_error();
  throw CheckpointError(detail.empty() ? what : what + ": " + detail);
}

H5Id file(hid_t id, const std::string& what) { return checked(id, H5Fclose, what); }
H5Id dataset(hid_t id, const std::string& what) { return checked(id, H5Dclose, what); }
H5Id space(hid_t id, const std::string& what) { return checked(id, H5Sclose, what); }
H5Id type(hid_t id, const std::string& what) { return checked(id, H5Tclose, what); }
H5Id plist(hid_t id, const std::string& what) { return checked(id, H5Pclose, what); }
H5Id attribute(hid_t id, const std::string& what) { return checked(id, H5Aclose, what); }
H5Id group(hid_t id, const std::string& what) { return checked(id, H5Gclose, what); }

H5Id create_file(const std::string& path) {
  // Format of HDF5 1.10 (needed for virtual datasets anyway); readable by
  // every HDF5 >= 1.10 tool.
  H5Id fapl = plist(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate");
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  return file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl),
              "cannot create " + path);
}

H5Id open_file_read(const std::string& path) {
  return file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT),
              "cannot open " + path + " as HDF5");
}

namespace {

struct StoredAs {
  hid_t file = H5I_INVALID_HID;
  hid_t memory = H5I_INVALID_HID;
};

// The HDF5 columns of the dtype table (kolos/core/dtype.h).
StoredAs stored_as(const std::string& dtype) {
#define KOLOS_H5_TYPES(name, scalar, size, safetensors, mpi, h5_file, h5_memory) \
  if (dtype == name) return StoredAs{h5_file, h5_memory};
  KOLOS_DTYPES(KOLOS_H5_TYPES)
#undef KOLOS_H5_TYPES
  return {};
}

StoredAs checked_stored_as(const std::string& dtype) {
  const StoredAs types = stored_as(dtype);
  if (types.file == H5I_INVALID_HID) {
    throw CheckpointError("checkpoints do not store dtype `" + dtype + "`");
  }
  return types;
}

}  // namespace

hid_t file_type(const std::string& dtype) { return checked_stored_as(dtype).file; }

hid_t memory_type(const std::string& dtype) { return checked_stored_as(dtype).memory; }

int64_t element_size(const std::string& dtype) {
  checked_stored_as(dtype);
  return find_dtype(dtype)->size;
}

bool known_dtype(const std::string& dtype) { return stored_as(dtype).file != H5I_INVALID_HID; }

H5Id create_dataset(hid_t file, const std::string& path, const std::string& dtype,
                    const std::vector<int64_t>& dims, hid_t dcpl) {
  std::vector<hsize_t> d(dims.begin(), dims.end());
  H5Id sp = space(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr),
                  "dataspace of " + path);
  H5Id lcpl = plist(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate");
  H5Pset_create_intermediate_group(lcpl, 1);
  return dataset(H5Dcreate2(file, path.c_str(), file_type(dtype), sp, lcpl, dcpl, H5P_DEFAULT),
                 "cannot create dataset " + path);
}

bool exists(hid_t file, const std::string& path) {
  // H5Lexists fails (rather than answering false) when an intermediate link
  // is missing: check each prefix.
  size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    if (!prefix.empty() && prefix != "/") {
      if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return false;
      }
    }
    if (pos == std::string::npos) return true;
  }
}

void write_attr(hid_t obj, const std::string& name, const std::vector<int64_t>& values) {
  hsize_t n = values.size();
  H5Id sp = space(n == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &n, nullptr),
                  "attribute " + name);
  H5Id a = attribute(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT),
                     "cannot create attribute " + name);
  if (n > 0 && H5Awrite(a, H5T_NATIVE_INT64, values.data()) < 0) fail("write attribute " + name);
}

void write_attr(hid_t obj, const std::string& name, int64_t value) {
  H5Id sp = space(H5Screate(H5S_SCALAR), "attribute " + name);
  H5Id a = attribute(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT),
                     "cannot create attribute " + name);
  if (H5Awrite(a, H5T_NATIVE_INT64, &value) < 0) fail("write attribute " + name);
}

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  // A fixed-length UTF-8 string: h5dump and h5py show it as text.
  H5Id t = type(H5Tcopy(H5T_C_S1), "string type");
  H5Tset_size(t, std::max<size_t>(1, value.size()));
  H5Tset_strpad(t, H5T_STR_NULLPAD);
  H5Tset_cset(t, H5T_CSET_UTF8);
  H5Id sp = space(H5Screate(H5S_SCALAR), "attribute " + name);
  H5Id a = attribute(H5Acreate2(obj, name.c_str(), t, sp, H5P_DEFAULT, H5P_DEFAULT),
                     "cannot create attribute " + name);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  if (H5Awrite(a, t, padded.data()) < 0) fail("write attribute " + name);
}

bool has_attr(hid_t obj, const std::string& name) {
  const htri_t r = H5Aexists(obj, name.c_str());
  if (r < 0) H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

std::vector<int64_t> read_attr_ints(hid_t obj, const std::string& name, int64_t max_count,
                                    const std::string& where) {
  if (!has_attr(obj, name)) throw CheckpointError(where + ": attribute " + name + " is missing");
  H5Id a = attribute(H5Aopen(obj, name.c_str(), H5P_DEFAULT), where + ": attribute " + name);
  H5Id t = type(H5Aget_type(a), where + ": attribute " + name);
  if (H5Tget_class(t) != H5T_INTEGER) {
    throw CheckpointError(where + ": attribute " + name + " is not an integer");
  }
  H5Id sp = space(H5Aget_space(a), where + ": attribute " + name);
  const hssize_t n = H5Sget_simple_extent_npoints(sp);
  if (n < 0 || n > max_count) {
    throw CheckpointError(where + ": attribute " + name + " has " + std::to_string(n) +
                          " values, at most " + std::to_string(max_count) + " expected");
  }
  std::vector<int64_t> values(static_cast<size_t>(n));
  if (n > 0 && H5Aread(a, H5T_NATIVE_INT64, values.data()) < 0) {
    fail(where + ": read attribute " + name);
  }
  return values;
}

int64_t read_attr_int(hid_t obj, const std::string& name, const std::string& where) {
  std::vector<int64_t> v = read_attr_ints(obj, name, 1, where);
  if (v.size() != 1) throw CheckpointError(where + ": attribute " + name + " is empty");
  return v[0];
}

std::string read_attr_string(hid_t obj, const std::string& name, int64_t max_length,
                             const std::string& where) {
  if (!has_attr(obj, name)) throw CheckpointError(where + ": attribute " + name + " is missing");
  H5Id a = attribute(H5Aopen(obj, name.c_str(), H5P_DEFAULT), where + ": attribute " + name);
  H5Id t = type(H5Aget_type(a), where + ": attribute " + name);
  if (H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) > 0) {
    throw CheckpointError(where + ": attribute " + name + " is not a fixed-length string");
  }
  H5Id sp = space(H5Aget_space(a), where + ": attribute " + name);
  const size_t size = H5Tget_size(t);
  if (H5Sget_simple_extent_npoints(sp) != 1 || size == 0 ||
      size > static_cast<size_t>(max_length)) {
    throw CheckpointError(where + ": attribute " + name + " is " + std::to_string(size) +
                          " bytes, at most " + std::to_string(max_length) + " expected");
  }
  std::string value(size, '\0');
  if (H5Aread(a, t, value.data()) < 0) fail(where + ": read attribute " + name);
  value.resize(std::min(value.size(), value.find('\0')));
  return value;
}

std::vector<int64_t> extents(hid_t dataset, int64_t max_numel, const std::string& where) {
  H5Id sp = space(H5Dget_space(dataset), where);
  const int rank = H5Sget_simple_extent_ndims(sp);
  if (rank < 0 || rank > H5S_MAX_RANK) {
    throw CheckpointError(where + ": dataspace of rank " + std::to_string(rank));
  }
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
  std::vector<int64_t> out;
  int64_t numel = 1;
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(max_numel) ||
        (d > 0 && numel > max_numel / static_cast<int64_t>(d))) {
      throw CheckpointError(where + ": extents exceed " + std::to_string(max_numel) +
                            " elements (a damaged or foreign file?)");
    }
    numel *= static_cast<int64_t>(d);
    out.push_back(static_cast<int64_t>(d));
  }
  return out;
}

namespace {
struct ListState {
  std::vector<std::string>* names;
  int64_t max_count;
};
herr_t collect(hid_t, const char* name, const H5L_info_t*, void* data) {
  auto* s = static_cast<ListState*>(data);
  if (static_cast<int64_t>(s->names->size()) >= s->max_count) return 1;  // stop: too many
  s->names->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> list_group(hid_t file, const std::string& group_path, int64_t max_count,
                                    const std::string& where) {
  std::vector<std::string> names;
  if (!exists(file, group_path)) return names;
  H5Id g = group(H5Gopen2(file, group_path.c_str(), H5P_DEFAULT), where + ": group " + group_path);
  ListState state{&names, max_count};
  hsize_t idx = 0;
  const herr_t r = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &state);
  if (r < 0) fail(where + ": list group " + group_path);
  if (r > 0) {
    throw CheckpointError(where + ": group " + group_path + " has more than " +
                          std::to_string(max_count) + " entries");
  }
  return names;
}

void read_rows(hid_t dataset, const std::vector<int64_t>& shape, const std::string& dtype,
               int64_t max_bytes, const std::string& where,
               const std::function<void(const char* data, size_t bytes)>& consume) {
  const int nd = static_cast<int>(shape.size());
  int64_t row = element_size(dtype);
  for (int d = 1; d < nd; ++d) row *= shape[d];
  const int64_t rows_per = std::max<int64_t>(1, max_bytes / std::max<int64_t>(1, row));
  std::vector<char> buf;
  H5Id fspace = space(H5Dget_space(dataset), where);
  for (int64_t r0 = 0; nd > 0 && r0 < shape[0]; r0 += rows_per) {
    const int64_t rows = std::min(rows_per, shape[0] - r0);
    std::vector<hsize_t> start(nd, 0), count(shape.begin(), shape.end());
    start[0] = static_cast<hsize_t>(r0);
    count[0] = static_cast<hsize_t>(rows);
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    H5Id mspace = space(H5Screate_simple(nd, count.data(), nullptr), where);
    buf.resize(static_cast<size_t>(rows * row));
    if (H5Dread(dataset, memory_type(dtype), mspace, fspace, H5P_DEFAULT, buf.data()) < 0) {
      fail("cannot read " + where);
    }
    consume(buf.data(), buf.size());
  }
}

}  // namespace kolos::checkpoint::h5
