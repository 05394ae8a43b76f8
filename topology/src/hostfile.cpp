#include "kolos/topology/hostfile.h"

#include <fstream>
#include <sstream>

#include "kolos/core/error.h"

namespace kolos::topology {

std::vector<HostSlots> read_hostfile(const std::string& path_or_text) {
  const bool is_text = path_or_text.find('\n') != std::string::npos;
  const std::string where = is_text ? "hostfile text" : path_or_text;
  std::string text = path_or_text;
  if (!is_text) {
    std::ifstream in(path_or_text);
    if (!in) throw Error("hostfile " + path_or_text + ": cannot open it");
    std::stringstream all;
    all << in.rdbuf();
    text = all.str();
  }
  std::vector<HostSlots> hosts;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host)) continue;
    const std::string at = where + ":" + std::to_string(number);
    int slots = -1;
    while (words >> word) {
      const auto eq = word.find('=');
      const std::string key = word.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : word.substr(eq + 1);
      if (key != "slots" && key != "max_slots" && key != "max-slots") {
        throw Error("hostfile " + at + ": unknown `" + word +
                    "` (expected `host slots=N [max_slots=M]`)");
      }
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 1) {
        throw Error("hostfile " + at + ": `" + word + "` is not a positive number of slots");
      }
      if (key == "slots") slots = static_cast<int>(n);
    }
    if (slots < 0) {
      throw Error("hostfile " + at + ": `" + host +
                  "` has no slots=N; kolos needs the slot count to know which ranks share a node");
    }
    bool merged = false;
    for (auto& h : hosts) {
      if (h.host == host) {
        h.slots += slots;
        merged = true;
      }
    }
    if (!merged) hosts.push_back({host, slots});
  }
  if (hosts.empty()) throw Error("hostfile " + where + ": no hosts");
  return hosts;
}

std::vector<std::string> hosts_by_block(const std::vector<HostSlots>& hosts, int world) {
  std::vector<std::string> out;
  for (const auto& h : hosts) {
    for (int s = 0; s < h.slots && static_cast<int>(out.size()) < world; ++s) out.push_back(h.host);
  }
  if (static_cast<int>(out.size()) < world) {
    throw Error("hostfile: " + std::to_string(world) + " ranks but only " +
                std::to_string(out.size()) +
                " slots (mpirun would refuse this without --oversubscribe)");
  }
  return out;
}

}  // namespace kolos::topology
