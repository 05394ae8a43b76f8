// The LibTorch side of the dtype table (kolos/core/dtype.h): each row's
// at::ScalarType. Only torch-linked code (libkolos_core and what links it)
// includes this header; the torch-free libraries use dtype.h alone.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

#include "kolos/core/dtype.h"

namespace kolos {

// The row of `type`; nullptr when kolos has none.
const DtypeInfo* find_dtype(at::ScalarType type);

// The at::ScalarType of a row.
at::ScalarType scalar_type(const DtypeInfo& dtype);

// The table's name of `type`, else LibTorch's ("ComplexFloat").
std::string dtype_name(at::ScalarType type);

}  // namespace kolos
