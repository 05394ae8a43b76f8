// libkolos_pmpi_count: see pmpi_count.h for what is counted and how.
//
// Each wrapper computes the call's payload and sent bytes from its own
// arguments (count x MPI_Type_size, the communicator's size and this rank),
// records them under the communicator's handle, and forwards to the PMPI_
// entry point. Nothing here changes what MPI does.
#include "pmpi_count.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

using Counters = std::array<kolos_pmpi_count, KOLOS_PMPI_KINDS>;

struct Registry {
  std::mutex mutex;
  std::unordered_map<MPI_Comm, Counters> by_comm;
};

// Never destroyed: MPI may be called from static destructors.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

void record(MPI_Comm comm, int kind, uint64_t payload, uint64_t sent) {
  if (comm == MPI_COMM_NULL) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  kolos_pmpi_count& c = r.by_comm[comm][kind];
  c.calls += 1;
  c.payload_bytes += payload;
  c.sent_bytes += sent;
}

uint64_t type_size(MPI_Datatype type) {
  int size = 0;
  if (type == MPI_DATATYPE_NULL || PMPI_Type_size(type, &size) != MPI_SUCCESS) return 0;
  return static_cast<uint64_t>(size);
}

uint64_t bytes(int count, MPI_Datatype type) {
  return count > 0 ? static_cast<uint64_t>(count) * type_size(type) : 0;
}

struct Shape {
  int size = 1, rank = 0;
};

Shape shape(MPI_Comm comm) {
  Shape s;
  PMPI_Comm_size(comm, &s.size);
  PMPI_Comm_rank(comm, &s.rank);
  return s;
}

std::string comm_name(MPI_Comm comm) {
  char name[MPI_MAX_OBJECT_NAME] = {0};
  int length = 0;
  if (PMPI_Comm_get_name(comm, name, &length) != MPI_SUCCESS) return "";
  return std::string(name, length);
}

void count_allreduce(int count, MPI_Datatype type, MPI_Comm comm) {
  const Shape s = shape(comm);
  const uint64_t x = bytes(count, type);
  record(comm, KOLOS_PMPI_ALLREDUCE, x, 2 * static_cast<uint64_t>(s.size - 1) * x / s.size);
}

void dump(const char* prefix) {
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string path = std::string(prefix) + "." + std::to_string(rank) + ".txt";
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) return;
  std::fprintf(out, "# communicator kind calls payload_bytes sent_bytes\n");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& [comm, counters] : r.by_comm) {
    const std::string name = comm_name(comm);
    for (int k = 0; k < KOLOS_PMPI_KINDS; ++k) {
      if (counters[k].calls == 0) continue;
      std::fprintf(out, "%s %s %llu %llu %llu\n", name.empty() ? "-" : name.c_str(),
                   kolos_pmpi_kind_name(k), static_cast<unsigned long long>(counters[k].calls),
                   static_cast<unsigned long long>(counters[k].payload_bytes),
                   static_cast<unsigned long long>(counters[k].sent_bytes));
    }
  }
  std::fclose(out);
}

}  // namespace

extern "C" {

const char* kolos_pmpi_kind_name(int kind) {
  static const char* const kNames[KOLOS_PMPI_KINDS] = {
      "send",      "recv",   "allreduce", "reduce",   "reduce_scatter",
      "allgather", "gather", "bcast",     "alltoall", "barrier"};
  return kind >= 0 && kind < KOLOS_PMPI_KINDS ? kNames[kind] : "?";
}

void kolos_pmpi_counts(MPI_Comm comm, kolos_pmpi_count* out) {
  std::memset(out, 0, sizeof(kolos_pmpi_count) * KOLOS_PMPI_KINDS);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_comm.find(comm);
  if (it != r.by_comm.end()) std::memcpy(out, it->second.data(), sizeof(Counters));
}

int kolos_pmpi_counts_by_name(const char* name, kolos_pmpi_count* out) {
  std::memset(out, 0, sizeof(kolos_pmpi_count) * KOLOS_PMPI_KINDS);
  int matched = 0;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& [comm, counters] : r.by_comm) {
    if (comm_name(comm) != name) continue;
    ++matched;
    for (int k = 0; k < KOLOS_PMPI_KINDS; ++k) {
      out[k].calls += counters[k].calls;
      out[k].payload_bytes += counters[k].payload_bytes;
      out[k].sent_bytes += counters[k].sent_bytes;
    }
  }
  return matched;
}

uint64_t kolos_pmpi_bytes_sent(MPI_Comm comm) {
  kolos_pmpi_count counts[KOLOS_PMPI_KINDS];
  kolos_pmpi_counts(comm, counts);
  uint64_t total = 0;
  for (const kolos_pmpi_count& c : counts) total += c.sent_bytes;
  return total;
}

void kolos_pmpi_reset(void) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& entry : r.by_comm) entry.second = Counters{};
}

// ---- wrappers ---------------------------------------------------------------

int MPI_Send(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
  record(comm, KOLOS_PMPI_SEND, bytes(count, type), bytes(count, type));
  return PMPI_Send(buf, count, type, dest, tag, comm);
}

int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request* request) {
  record(comm, KOLOS_PMPI_SEND, bytes(count, type), bytes(count, type));
  return PMPI_Isend(buf, count, type, dest, tag, comm, request);
}

int MPI_Recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
             MPI_Status* status) {
  record(comm, KOLOS_PMPI_RECV, bytes(count, type), 0);
  return PMPI_Recv(buf, count, type, source, tag, comm, status);
}

int MPI_Irecv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
              MPI_Request* request) {
  record(comm, KOLOS_PMPI_RECV, bytes(count, type), 0);
  return PMPI_Irecv(buf, count, type, source, tag, comm, request);
}

int MPI_Sendrecv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, int dest, int sendtag,
                 void* recvbuf, int recvcount, MPI_Datatype recvtype, int source, int recvtag,
                 MPI_Comm comm, MPI_Status* status) {
  record(comm, KOLOS_PMPI_SEND, bytes(sendcount, sendtype), bytes(sendcount, sendtype));
  record(comm, KOLOS_PMPI_RECV, bytes(recvcount, recvtype), 0);
  return PMPI_Sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype,
                       source, recvtag, comm, status);
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op,
                  MPI_Comm comm) {
  count_allreduce(count, type, comm);
  return PMPI_Allreduce(sendbuf, recvbuf, count, type, op, comm);
}

int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op,
                   MPI_Comm comm, MPI_Request* request) {
  count_allreduce(count, type, comm);
  return PMPI_Iallreduce(sendbuf, recvbuf, count, type, op, comm, request);
}

int MPI_Reduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op,
               int root, MPI_Comm comm) {
  const Shape s = shape(comm);
  const uint64_t x = bytes(count, type);
  record(comm, KOLOS_PMPI_REDUCE, x, s.rank == root ? 0 : x);
  return PMPI_Reduce(sendbuf, recvbuf, count, type, op, root, comm);
}

int MPI_Reduce_scatter(const void* sendbuf, void* recvbuf, const int recvcounts[],
                       MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  const Shape s = shape(comm);
  uint64_t total = 0;
  for (int r = 0; r < s.size; ++r) total += bytes(recvcounts[r], type);
  record(comm, KOLOS_PMPI_REDUCE_SCATTER, total, total - bytes(recvcounts[s.rank], type));
  return PMPI_Reduce_scatter(sendbuf, recvbuf, recvcounts, type, op, comm);
}

int MPI_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype type,
                             MPI_Op op, MPI_Comm comm) {
  const Shape s = shape(comm);
  const uint64_t block = bytes(recvcount, type);
  record(comm, KOLOS_PMPI_REDUCE_SCATTER, block * s.size, block * (s.size - 1));
  return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, type, op, comm);
}

int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  const Shape s = shape(comm);
  const uint64_t x =
      sendbuf == MPI_IN_PLACE ? bytes(recvcount, recvtype) : bytes(sendcount, sendtype);
  record(comm, KOLOS_PMPI_ALLGATHER, x, x * (s.size - 1));
  return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

int MPI_Allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                   const int recvcounts[], const int displs[], MPI_Datatype recvtype,
                   MPI_Comm comm) {
  const Shape s = shape(comm);
  const uint64_t x =
      sendbuf == MPI_IN_PLACE ? bytes(recvcounts[s.rank], recvtype) : bytes(sendcount, sendtype);
  record(comm, KOLOS_PMPI_ALLGATHER, x, x * (s.size - 1));
  return PMPI_Allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm);
}

int MPI_Gather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
               int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm) {
  const Shape s = shape(comm);
  const uint64_t x =
      sendbuf == MPI_IN_PLACE ? bytes(recvcount, recvtype) : bytes(sendcount, sendtype);
  record(comm, KOLOS_PMPI_GATHER, x, s.rank == root ? 0 : x);
  return PMPI_Gather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
}

int MPI_Gatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root,
                MPI_Comm comm) {
  const Shape s = shape(comm);
  const uint64_t x = sendbuf == MPI_IN_PLACE ? 0 : bytes(sendcount, sendtype);
  record(comm, KOLOS_PMPI_GATHER, x, s.rank == root ? 0 : x);
  return PMPI_Gatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, root,
                      comm);
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  const Shape s = shape(comm);
  const uint64_t x = bytes(count, type);
  record(comm, KOLOS_PMPI_BCAST, x, s.rank == root ? x * (s.size - 1) : 0);
  return PMPI_Bcast(buffer, count, type, root, comm);
}

int MPI_Alltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                 int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  const Shape s = shape(comm);
  const uint64_t x =
      sendbuf == MPI_IN_PLACE ? bytes(recvcount, recvtype) : bytes(sendcount, sendtype);
  record(comm, KOLOS_PMPI_ALLTOALL, x * s.size, x * (s.size - 1));
  return PMPI_Alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

int MPI_Alltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[],
                  MPI_Datatype sendtype, void* recvbuf, const int recvcounts[], const int rdispls[],
                  MPI_Datatype recvtype, MPI_Comm comm) {
  const Shape s = shape(comm);
  const bool in_place = sendbuf == MPI_IN_PLACE;
  const int* counts = in_place ? recvcounts : sendcounts;
  const MPI_Datatype type = in_place ? recvtype : sendtype;
  uint64_t payload = 0, sent = 0;
  for (int r = 0; r < s.size; ++r) {
    payload += bytes(counts[r], type);
    if (r != s.rank) sent += bytes(counts[r], type);
  }
  record(comm, KOLOS_PMPI_ALLTOALL, payload, sent);
  return PMPI_Alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls,
                        recvtype, comm);
}

int MPI_Barrier(MPI_Comm comm) {
  record(comm, KOLOS_PMPI_BARRIER, 0, 0);
  return PMPI_Barrier(comm);
}

int MPI_Comm_free(MPI_Comm* comm) {
  if (comm != nullptr) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.by_comm.erase(*comm);
  }
  return PMPI_Comm_free(comm);
}

int MPI_Finalize(void) {
  if (const char* prefix = std::getenv("KOLOS_PMPI_DUMP")) dump(prefix);
  return PMPI_Finalize();
}

}  // extern "C"
