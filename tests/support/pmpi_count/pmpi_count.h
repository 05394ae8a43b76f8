/* libkolos_pmpi_count: a PMPI interposition library that counts, per
 * communicator and per kind of operation, what a process hands to MPI.
 * Tests link it ahead of libmpi (or LD_PRELOAD it), so every MPI_* call of
 * the process, kolos's ProcessGroup included, passes through it first.
 *
 * What is counted, per call (n = size of the communicator, p = this rank,
 * E = MPI_Type_size of the datatype, from the arguments MPI received):
 *
 *   kind            calls                    payload bytes          sent bytes
 *   send            MPI_Send, MPI_Isend,     count E                count E
 *                   MPI_Sendrecv (send part)
 *   recv            MPI_Recv, MPI_Irecv,     count E                0
 *                   MPI_Sendrecv (recv part)
 *   allreduce       MPI_Allreduce,           count E = X            2 (n-1) X / n
 *                   MPI_Iallreduce
 *   reduce          MPI_Reduce               count E = X            root 0, others X
 *   reduce_scatter  MPI_Reduce_scatter,      sum(recvcounts) E = X  X - recvcounts[p] E
 *                   MPI_Reduce_scatter_block (block: n recvcount E)
 *   allgather       MPI_Allgather,           own contribution x     (n-1) x
 *                   MPI_Allgatherv           (MPI_IN_PLACE: own
 *                                            slot of the receive
 *                                            counts)
 *   gather          MPI_Gather, MPI_Gatherv  sendcount E = x        root 0, others x
 *   bcast           MPI_Bcast                count E = X            root (n-1) X, others 0
 *   alltoall        MPI_Alltoall(v)          all send counts E      send counts to ranks != p
 *   barrier         MPI_Barrier              0                      0
 *
 * "payload bytes" are the bytes of the buffer this rank handed to MPI for
 * the call. "sent bytes" are what this rank sends over the network when MPI
 * runs the bandwidth-optimal algorithm for the call MPI actually received
 * (ring all-reduce, reduce-scatter and all-gather; direct point-to-point,
 * all-to-all and gather; a root that sends to every rank for broadcast),
 * computed per call with integer division. MPI's own algorithms may move
 * other byte counts on the wire (a binomial-tree broadcast, recursive
 * doubling for small all-reduces); the model is what traffic formulas are
 * written in, and it depends only on what the process asked MPI to do.
 *
 * Counters are kept per MPI_Comm handle and dropped by MPI_Comm_free, so a
 * handle reused by a later communicator starts from zero. Thread-safe (the
 * ProcessGroup's communication threads call MPI concurrently).
 *
 * With KOLOS_PMPI_DUMP=PREFIX in the environment, MPI_Finalize writes the
 * counters of the communicators still alive to PREFIX.<world rank>.txt. */
#ifndef KOLOS_TESTS_SUPPORT_PMPI_COUNT_H_
#define KOLOS_TESTS_SUPPORT_PMPI_COUNT_H_

#include <mpi.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum kolos_pmpi_kind {
  KOLOS_PMPI_SEND = 0,
  KOLOS_PMPI_RECV,
  KOLOS_PMPI_ALLREDUCE,
  KOLOS_PMPI_REDUCE,
  KOLOS_PMPI_REDUCE_SCATTER,
  KOLOS_PMPI_ALLGATHER,
  KOLOS_PMPI_GATHER,
  KOLOS_PMPI_BCAST,
  KOLOS_PMPI_ALLTOALL,
  KOLOS_PMPI_BARRIER,
  KOLOS_PMPI_KINDS
};

typedef struct kolos_pmpi_count {
  uint64_t calls;
  uint64_t payload_bytes;
  uint64_t sent_bytes;
} kolos_pmpi_count;

/* "allreduce", "reduce_scatter", ...; "?" outside the range. */
const char* kolos_pmpi_kind_name(int kind);

/* Copies the counters of `comm` into out[KOLOS_PMPI_KINDS] (zeros for a
 * communicator that has not been used). */
void kolos_pmpi_counts(MPI_Comm comm, kolos_pmpi_count* out);

/* Adds the counters of every live communicator whose MPI name
 * (MPI_Comm_set_name; kolos names a ProcessGroup's communicator after the
 * group) equals `name` to out[KOLOS_PMPI_KINDS], which it zeroes first.
 * Returns how many communicators matched. */
int kolos_pmpi_counts_by_name(const char* name, kolos_pmpi_count* out);

/* Sent bytes of `comm`, all kinds together. */
uint64_t kolos_pmpi_bytes_sent(MPI_Comm comm);

/* Zeroes every counter. */
void kolos_pmpi_reset(void);

#ifdef __cplusplus
}
#endif

#endif /* KOLOS_TESTS_SUPPORT_PMPI_COUNT_H_ */
