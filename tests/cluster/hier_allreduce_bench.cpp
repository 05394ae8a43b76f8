// cluster_hier_allreduce_bench: a flat all-reduce against a hierarchical
// one (reduce inside the node, all-reduce among one leader per node,
// broadcast inside the node), float32 sum, for gradient-bucket sizes.
//
//   mpirun -np 4 --hostfile ... cluster_hier_allreduce_bench [MiB ...] [--rounds R]
//                                                 [--cluster FILE]
//
// Raw MPI on the world's ranks, no kolos: it measures what a hierarchical
// reduction of dp buckets would buy on a machine's links before kolos's
// engine does it. "Node" is MPI_COMM_TYPE_SHARED, what Open MPI considers
// one host (on the namespace cluster: one namespace). Each size runs one
// warm-up of each path, then R rounds (default 5) alternating the order of
// the two paths; a round's time is the slowest rank's; the table shows the
// median. Both paths' results are compared with the exact sum (every rank
// fills its buffer with small integers, exact in float32), and the program
// exits 1 when they differ: the correctness is checked, the times are only
// printed. With --cluster, a planner cluster file describing the machine
// (examples/clusters/netns-2x2.toml for the namespace cluster), the
// planner's predictions of both paths (kolos::planner::mpi_all_reduce_paths,
// the alpha-beta terms of kolos's flat and hierarchical all-reduce) are
// printed beside the measurements.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kolos/planner/cost_model.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Comms {
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm node = MPI_COMM_NULL;     // the ranks of this node
  MPI_Comm leaders = MPI_COMM_NULL;  // node rank 0 of every node (else MPI_COMM_NULL)
  int rank = 0, size = 1, node_rank = 0, node_size = 1, nodes = 1;
};

Comms make_comms() {
  Comms c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c.world);
  MPI_Comm_rank(c.world, &c.rank);
  MPI_Comm_size(c.world, &c.size);
  MPI_Comm_split_type(c.world, MPI_COMM_TYPE_SHARED, c.rank, MPI_INFO_NULL, &c.node);
  MPI_Comm_rank(c.node, &c.node_rank);
  MPI_Comm_size(c.node, &c.node_size);
  MPI_Comm_split(c.world, c.node_rank == 0 ? 0 : MPI_UNDEFINED, c.rank, &c.leaders);
  int leader = c.node_rank == 0 ? 1 : 0;
  MPI_Allreduce(&leader, &c.nodes, 1, MPI_INT, MPI_SUM, c.world);
  return c;
}

void free_comms(Comms& c) {
  if (c.leaders != MPI_COMM_NULL) MPI_Comm_free(&c.leaders);
  MPI_Comm_free(&c.node);
  MPI_Comm_free(&c.world);
}

void flat(const Comms& c, std::vector<float>& buf) {
  MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM,
                c.world);
}

void hierarchical(const Comms& c, std::vector<float>& buf) {
  const int n = static_cast<int>(buf.size());
  if (c.node_rank == 0) {
    MPI_Reduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, 0, c.node);
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, c.leaders);
  } else {
    MPI_Reduce(buf.data(), nullptr, n, MPI_FLOAT, MPI_SUM, 0, c.node);
  }
  MPI_Bcast(buf.data(), n, MPI_FLOAT, 0, c.node);
}

void fill(std::vector<float>& buf, int rank) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>((i + rank) % 7);
}

// Every element equals the sum over ranks of (i + r) % 7.
bool exact(const std::vector<float>& buf, int size) {
  for (size_t i = 0; i < buf.size(); ++i) {
    float want = 0;
    for (int r = 0; r < size; ++r) want += static_cast<float>((i + r) % 7);
    if (buf[i] != want) return false;
  }
  return true;
}

template <typename Path>
double timed(const Comms& c, std::vector<float>& buf, Path&& path, bool* ok) {
  fill(buf, c.rank);
  MPI_Barrier(c.world);
  const auto start = std::chrono::steady_clock::now();
  path(c, buf);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, c.world);
  int good = exact(buf, c.size) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &good, 1, MPI_INT, MPI_MIN, c.world);
  *ok = *ok && good;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::vector<int> sizes_mib;
  int rounds = 5;
  std::string cluster_file;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cluster") == 0 && i + 1 < argc) {
      cluster_file = argv[++i];
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      sizes_mib.push_back(std::max(1, std::atoi(argv[i])));
    }
  }
  if (sizes_mib.empty()) sizes_mib = {1, 16, 64};
  Comms c = make_comms();
  kolos::planner::Cluster cluster;
  if (!cluster_file.empty()) {
    try {
      cluster = kolos::planner::load_cluster(cluster_file).cluster;
    } catch (const std::exception& e) {
      if (c.rank == 0) std::fprintf(stderr, "%s\n", e.what());
      free_comms(c);
      MPI_Finalize();
      return 2;
    }
  }
  const bool predict = !cluster_file.empty();
  if (c.rank == 0) {
    std::printf(
        "%d ranks on %d node(s), %d on node 0; %d round(s) per size, median of the "
        "slowest rank's time\n",
        c.size, c.nodes, c.node_size, rounds);
    if (predict) {
      std::printf("planner's prediction from %s (%s: %lld nodes x %lld ranks, node link %.3g "
                  "bytes/s, shared memory %.3g bytes/s)\n",
                  cluster_file.c_str(), cluster.name.c_str(), (long long)cluster.nodes,
                  (long long)cluster.devices_per_node,
                  cluster.inter_bandwidth * static_cast<double>(cluster.devices_per_node),
                  cluster.intra_bandwidth);
    }
    std::printf("%8s %10s %10s %12s %12s %10s", "MiB", "flat ms", "hier ms", "flat GB/s",
                "hier GB/s", "flat/hier");
    if (predict) std::printf(" %12s %12s %10s", "pred flat", "pred hier", "pred f/h");
    std::printf("\n");
  }
  bool ok = true;
  for (int mib : sizes_mib) {
    std::vector<float> buf((static_cast<size_t>(mib) << 20) / sizeof(float));
    timed(c, buf, flat, &ok);
    timed(c, buf, hierarchical, &ok);
    std::vector<double> tf, th;
    for (int r = 0; r < rounds; ++r) {
      if (r % 2 == 0) {
        tf.push_back(timed(c, buf, flat, &ok));
        th.push_back(timed(c, buf, hierarchical, &ok));
      } else {
        th.push_back(timed(c, buf, hierarchical, &ok));
        tf.push_back(timed(c, buf, flat, &ok));
      }
    }
    const double f = median(tf), h = median(th);
    const double bytes = static_cast<double>(buf.size() * sizeof(float));
    if (c.rank == 0) {
      std::printf("%8d %10.1f %10.1f %12.3f %12.3f %10.2f", mib, f * 1e3, h * 1e3,
                  bytes / f / 1e9, bytes / h / 1e9, f / h);
      if (predict) {
        const auto p = kolos::planner::mpi_all_reduce_paths(cluster, bytes, c.size);
        std::printf(" %12.1f %12.1f %10.2f", p.flat * 1e3, p.hierarchical * 1e3,
                    p.flat / p.hierarchical);
      }
      std::printf("\n");
    }
  }
  if (c.rank == 0) {
    std::printf("results: %s\n", ok ? "both paths exact" : "WRONG: a path's sum differs");
  }
  free_comms(c);
  MPI_Finalize();
  return ok ? 0 : 1;
}
