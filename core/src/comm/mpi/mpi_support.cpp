// The MPI backend's helpers that need no tensors: MPI error strings, the
// dtype table's MPI datatypes, the MPI datatype and reduction operations for
// 16-bit floats (HalfTypes), the world ranks of a communicator, and the
// chunks that keep each MPI call within the element limit.
#include "mpi_support.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <climits>
#include <mutex>

#include "kolos/core/dtype.h"

namespace kolos::comm::mpi_detail {

std::atomic<int64_t> g_max_count{INT_MAX};

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return concat("MPI error ", code);
  return concat(std::string(text, length), " (MPI error ", code, ")");
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

MPI_Datatype table_datatype(at::ScalarType type) {
#define KOLOS_MPI_DATATYPE(name, scalar, size, safetensors, mpi, h5_file, h5_memory) \
  case at::ScalarType::scalar:                                                       \
    return mpi;
  switch (type) {
    KOLOS_DTYPES(KOLOS_MPI_DATATYPE)
    default:
      break;
  }
#undef KOLOS_MPI_DATATYPE
  return MPI_DATATYPE_NULL;
}

std::string supported_dtypes() {
  return dtype_names() + " (bool for broadcast, gathers, all_to_all and send/recv only)";
}

// ---- 16-bit floating point ------------------------------------------------
// MPI has no bfloat16/float16 type. They travel as a 2-byte contiguous type,
// and reductions use user-defined operations that widen each pair to float,
// combine, and round back. Each combination step rounds, so a sum over n ranks
// rounds n-1 times (as NCCL's bf16 ring does), not once.
namespace {

template <typename T, typename Combine>
void combine_16bit(const void* in, void* inout, const int* length, Combine combine) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) {
    b[i] = T(combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}

struct Plus {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return a > b ? a : b; }
};
struct Min {
  float operator()(float a, float b) const { return a < b ? a : b; }
};

template <typename T, typename Combine>
void mpi_user_op(void* in, void* inout, int* length, MPI_Datatype*) {
  combine_16bit<T>(in, inout, length, Combine{});
}

}  // namespace

HalfTypes::HalfTypes() {
  check(MPI_Type_contiguous(2, MPI_BYTE, &type_), "MPI_Type_contiguous");
  check(MPI_Type_commit(&type_), "MPI_Type_commit");
  check(MPI_Op_create(&mpi_user_op<c10::BFloat16, Plus>, 1, &bf16_[kSumIndex]), "MPI_Op_create");
  check(MPI_Op_create(&mpi_user_op<c10::BFloat16, Max>, 1, &bf16_[kMaxIndex]), "MPI_Op_create");
  check(MPI_Op_create(&mpi_user_op<c10::BFloat16, Min>, 1, &bf16_[kMinIndex]), "MPI_Op_create");
  check(MPI_Op_create(&mpi_user_op<c10::Half, Plus>, 1, &fp16_[kSumIndex]), "MPI_Op_create");
  check(MPI_Op_create(&mpi_user_op<c10::Half, Max>, 1, &fp16_[kMaxIndex]), "MPI_Op_create");
  check(MPI_Op_create(&mpi_user_op<c10::Half, Min>, 1, &fp16_[kMinIndex]), "MPI_Op_create");
}

HalfTypes::~HalfTypes() {
  if (mpi_finalized()) return;  // contract broken; nothing can be freed any more
  for (MPI_Op* ops : {bf16_, fp16_}) {
    for (int i = 0; i < kIndexCount; ++i) {
      if (ops[i] != MPI_OP_NULL) MPI_Op_free(&ops[i]);
    }
  }
  if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
}

std::shared_ptr<HalfTypes> HalfTypes::acquire() {
  static std::mutex mutex;
  static std::weak_ptr<HalfTypes> current;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<HalfTypes> types = current.lock();
  if (!types) {
    types = std::make_shared<HalfTypes>();
    current = types;
  }
  return types;
}

void HalfTypes::check(int code, const char* call) {
  if (code != MPI_SUCCESS) {
    throw CommError(concat(
        call, " failed while creating the MPI types for 16-bit floats: ", mpi_error_string(code)));
  }
}

std::string describe_world_ranks(MPI_Comm comm, int size) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> local(size), global(size, MPI_UNDEFINED);
  for (int i = 0; i < size; ++i) local[i] = i;
  MPI_Group_translate_ranks(group, size, local.data(), world, global.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  constexpr int kShown = 16;
  std::string out;
  for (int i = 0; i < size && i < kShown; ++i) {
    out += (i ? "," : "") +
           (global[i] == MPI_UNDEFINED ? std::string("?") : std::to_string(global[i]));
  }
  if (size > kShown) out += ",... (" + std::to_string(size) + " ranks)";
  return out;
}

std::vector<std::pair<int64_t, int>> chunks(int64_t numel) {
  const int64_t limit = max_count();
  std::vector<std::pair<int64_t, int>> out;
  int64_t offset = 0;
  do {
    const int64_t count = std::min(limit, numel - offset);
    out.emplace_back(offset, static_cast<int>(count));
    offset += count;
  } while (offset < numel);
  return out;
}

}  // namespace kolos::comm::mpi_detail
