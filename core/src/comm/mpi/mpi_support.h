// Private to the MPI backend: the helpers that need MPI but no tensors.
// MPI error strings, the element limit of one MPI call and the chunks it
// implies, the dtype table's MPI datatypes, the MPI datatype and reduction
// operations for 16-bit floats, and the world ranks of a communicator.
#pragma once

#include <c10/core/ScalarType.h>
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolos/core/error.h"

// Private to libkolos_core: not exported from the library.
#pragma GCC visibility push(hidden)
namespace kolos::comm::mpi_detail {

using ::kolos::detail::concat;

// The element limit of one MPI call; see detail::set_max_mpi_count
// (kolos/core/comm/mpi.h).
extern std::atomic<int64_t> g_max_count;

inline int64_t max_count() { return g_max_count.load(std::memory_order_relaxed); }

std::string mpi_error_string(int code);

bool mpi_finalized();

// The MPI datatype of each dtype, from the dtype table (kolos/core/dtype.h);
// MPI_DATATYPE_NULL for the 16-bit floats, which travel as HalfTypes::type().
MPI_Datatype table_datatype(at::ScalarType type);

std::string supported_dtypes();

// ---- 16-bit floating point ------------------------------------------------

// The MPI datatype and operations for 16-bit floats, shared by all groups
// alive at a time: created by the first group (under a mutex), freed when the
// last group that uses them is destroyed, which the contract places before
// MPI_Finalize. A later group creates them again.
class HalfTypes {
 public:
  enum Index { kSumIndex = 0, kMaxIndex, kMinIndex, kIndexCount };

  HalfTypes();
  HalfTypes(const HalfTypes&) = delete;
  HalfTypes& operator=(const HalfTypes&) = delete;

  ~HalfTypes();

  MPI_Datatype type() const { return type_; }
  MPI_Op op(at::ScalarType dtype, Index index) const {
    return dtype == at::kBFloat16 ? bf16_[index] : fp16_[index];
  }

  static std::shared_ptr<HalfTypes> acquire();

 private:
  static void check(int code, const char* call);

  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_[kIndexCount] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op fp16_[kIndexCount] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

// The MPI_COMM_WORLD ranks of `comm`'s members in its rank order: "0,2,4";
// long lists are cut ("0,1,2,...,255 (256 ranks)").
std::string describe_world_ranks(MPI_Comm comm, int size);

// Chunks [offset, offset + count) covering `numel` elements; at least one
// (possibly empty) chunk, so that empty point-to-point messages still match.
std::vector<std::pair<int64_t, int>> chunks(int64_t numel);

}  // namespace kolos::comm::mpi_detail
#pragma GCC visibility pop
