// The LibTorch side of the dtype table (kolos/core/dtype_torch.h), in
// libkolos_core.
#include "kolos/core/dtype_torch.h"

#include <cstring>

namespace kolos {
namespace {

struct ScalarRow {
  const char* name;
  at::ScalarType scalar;
};

#define KOLOS_DTYPE_SCALAR(name, scalar, size, safetensors, mpi, h5_file, h5_memory) \
  ScalarRow{name, at::ScalarType::scalar},
constexpr ScalarRow kScalars[] = {KOLOS_DTYPES(KOLOS_DTYPE_SCALAR)};
#undef KOLOS_DTYPE_SCALAR

}  // namespace

const DtypeInfo* find_dtype(at::ScalarType type) {
  for (const auto& row : kScalars) {
    if (row.scalar == type) return find_dtype(std::string(row.name));
  }
  return nullptr;
}

at::ScalarType scalar_type(const DtypeInfo& dtype) {
  for (const auto& row : kScalars) {
    if (std::strcmp(row.name, dtype.name) == 0) return row.scalar;
  }
  return at::ScalarType::Undefined;  // unreachable: every row has a scalar
}

std::string dtype_name(at::ScalarType type) {
  const DtypeInfo* d = find_dtype(type);
  return d ? d->name : c10::toString(type);
}

}  // namespace kolos
