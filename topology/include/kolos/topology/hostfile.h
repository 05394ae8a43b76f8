// OpenMPI hostfiles ("node01 slots=8"), read as the rank-to-node layout
// mpirun's default block mapping (--map-by slot) makes of them.
#pragma once

#include <string>
#include <vector>

namespace kolos::topology {

struct HostSlots {
  std::string host;
  int slots = 0;
};

// Parses an OpenMPI hostfile: a path, or the text itself when it contains
// a newline. One host per line, `host slots=N` (max_slots=M accepted and
// ignored), '#' comments, blank lines; a host listed twice adds its slots.
// Throws kolos::Error naming file:line for a line without slots= (kolos
// needs the count to know which ranks share a node), a bad number, or an
// unknown key.
std::vector<HostSlots> read_hostfile(const std::string& path_or_text);

// The host of each of WORLD ranks under block mapping: the first host's
// slots are filled first, then the next host's. Throws when WORLD exceeds
// the slots (mpirun would refuse it without --oversubscribe).
std::vector<std::string> hosts_by_block(const std::vector<HostSlots>& hosts, int world);

}  // namespace kolos::topology
