// Element types: one row per dtype kolos communicates or stores.
//
// KOLOS_DTYPES(X) is the table. Each library expands the columns it needs
// with its own X: the MPI backend the MPI datatype, the checkpoint library the
// HDF5 types, `kolos ckpt export` the safetensors tag, find_dtype() below the
// rest. A macro argument is expanded only where X uses it, so this header
// needs neither <mpi.h> nor <hdf5.h> nor LibTorch: it is torch-free, and so
// are the checkpoint readers and the fuzz targets that include it
// (docs/building.md, "Torch-free libraries"). The LibTorch side of the table
// (at::ScalarType) is kolos/core/dtype_torch.h. (The same device as
// LibTorch's AT_FORALL_SCALAR_TYPES.)
//
// Columns:
//   name         the name in messages and in a checkpoint's kolos.dtype attribute
//   scalar       the at::ScalarType enumerator's name (at::ScalarType::scalar),
//                bare so that only dtype_torch.h's expansions name LibTorch
//   size         bytes per element
//   safetensors  the safetensors header tag
//   mpi          the MPI datatype; MPI_DATATYPE_NULL for the 16-bit floats,
//                which MPI lacks: the MPI backend sends them as a 2-byte type
//                and reduces them with its own operations
//   h5_file      the HDF5 type datasets are stored as; the 16-bit floats are
//                stored as little-endian uint16 (HDF5 1.10 has no such types)
//                and the kolos.dtype attribute says which they are;
//                H5I_INVALID_HID: checkpoints do not store this dtype
//   h5_memory    the HDF5 memory type LibTorch's buffer is read/written as
#pragma once

#include <cstdint>
#include <string>

// clang-format off
#define KOLOS_DTYPES(X)                                                                                   \
  /* name        scalar          size  safetensors  mpi                 h5_file          h5_memory */       \
  X("float32",   Float,          4,    "F32",       MPI_FLOAT,          H5T_IEEE_F32LE,  H5T_NATIVE_FLOAT)  \
  X("float64",   Double,         8,    "F64",       MPI_DOUBLE,         H5T_IEEE_F64LE,  H5T_NATIVE_DOUBLE) \
  X("bfloat16",  BFloat16,       2,    "BF16",      MPI_DATATYPE_NULL,  H5T_STD_U16LE,   H5T_NATIVE_UINT16) \
  X("float16",   Half,           2,    "F16",       MPI_DATATYPE_NULL,  H5T_STD_U16LE,   H5T_NATIVE_UINT16) \
  X("int64",     Long,           8,    "I64",       MPI_INT64_T,        H5T_STD_I64LE,   H5T_NATIVE_INT64)  \
  X("int32",     Int,            4,    "I32",       MPI_INT32_T,        H5T_STD_I32LE,   H5T_NATIVE_INT32)  \
  X("uint8",     Byte,           1,    "U8",        MPI_UINT8_T,        H5T_STD_U8LE,    H5T_NATIVE_UINT8)  \
  X("int8",      Char,           1,    "I8",        MPI_INT8_T,         H5I_INVALID_HID, H5I_INVALID_HID)   \
  X("bool",      Bool,           1,    "BOOL",      MPI_C_BOOL,         H5I_INVALID_HID, H5I_INVALID_HID)
// clang-format on

namespace kolos {

struct DtypeInfo {
  const char* name;
  int64_t size;
  const char* safetensors;
};

// The row of the name `name`; nullptr when kolos has none.
const DtypeInfo* find_dtype(const std::string& name);

// The row of a safetensors tag ("F32", "BF16", ...); nullptr when none.
const DtypeInfo* find_dtype_by_safetensors(const std::string& tag);

// "float32, float64, ..., bool": every name in the table, for messages.
std::string dtype_names();

}  // namespace kolos
