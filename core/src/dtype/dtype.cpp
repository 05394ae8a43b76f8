#include "kolos/core/dtype.h"

namespace kolos {
namespace {

#define KOLOS_DTYPE_INFO(name, scalar, size, safetensors, mpi, h5_file, h5_memory) \
  DtypeInfo{name, scalar, size, safetensors},
constexpr DtypeInfo kDtypes[] = {KOLOS_DTYPES(KOLOS_DTYPE_INFO)};
#undef KOLOS_DTYPE_INFO

}  // namespace

const DtypeInfo* find_dtype(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.scalar == type) return &d;
  }
  return nullptr;
}

const DtypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

std::string dtype_name(at::ScalarType type) {
  const DtypeInfo* d = find_dtype(type);
  return d ? d->name : c10::toString(type);
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
