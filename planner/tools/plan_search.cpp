// Runs the search for one GPT shape on one cluster file and prints the top
// plans and the drop reasons (format_plans): the planner without kolos's
// command line, until `kolos plan` is wired to it.
//
//   kolos_planner_search CLUSTER.toml RANKS LAYERS HIDDEN HEADS SEQ VOCAB GLOBAL_BATCH
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "kolos/planner/search.h"

using namespace kolos::planner;

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr,
                 "usage: %s CLUSTER.toml RANKS LAYERS HIDDEN HEADS SEQ VOCAB GLOBAL_BATCH\n",
                 argv[0]);
    return 2;
  }
  try {
    const ClusterFile file = load_cluster(argv[1]);
    const Machine machine{file.cluster, file.rates};
    Workload w;
    w.model.name = "gpt";
    w.model.layers = std::atoll(argv[3]);
    w.model.hidden = std::atoll(argv[4]);
    w.model.heads = std::atoll(argv[5]);
    w.model.seq_len = std::atoll(argv[6]);
    w.model.vocab = std::atoll(argv[7]);
    w.global_batch = std::atoll(argv[8]);
    SearchOptions opt;
    opt.ranks = std::atoll(argv[2]);
    const SearchResult r = search(w, machine, opt);
    std::printf("%s", format_plans(r, w, machine).c_str());
    return r.plans.empty() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolos_planner_search: %s\n", e.what());
    return 2;
  }
}
