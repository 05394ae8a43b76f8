// The torch-free side of the dtype table (kolos/core/dtype.h), in
// libkolos_base.
#include "kolos/core/dtype.h"

namespace kolos {
namespace {

#define KOLOS_DTYPE_INFO(name, scalar, size, safetensors, mpi, h5_file, h5_memory) \
  DtypeInfo{name, size, safetensors},
constexpr DtypeInfo kDtypes[] = {KOLOS_DTYPES(KOLOS_DTYPE_INFO)};
#undef KOLOS_DTYPE_INFO

}  // namespace

const DtypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DtypeInfo* find_dtype_by_safetensors(const std::string& tag) {
  for (const auto& d : kDtypes) {
    if (tag == d.safetensors) return &d;
  }
  return nullptr;
}

std::string dtype_names() {
  std::string out;
  for (const auto& d : kDtypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

}  // namespace kolos
