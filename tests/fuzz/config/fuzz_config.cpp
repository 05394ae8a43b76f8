// libFuzzer target: the config reader. Any bytes as a TOML file must give a
// RunConfig or a kolos::ConfigError, never a crash, a hang or another
// exception. A config that reads must also resolve its mesh (or refuse) for
// a few world sizes, and print as TOML that reads back to the same text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kolos/core/error.h"
#include "kolos/core/run_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kolos::RunConfig config;
  try {
    config = kolos::parse_run_config(text, "fuzz.toml");
  } catch (const kolos::ConfigError&) {
    return 0;
  }
  for (const int64_t world : {1, 2, 3, 4, 8, 1024}) {
    try {
      kolos::resolve_mesh_shape(config, world);
    } catch (const kolos::ConfigError&) {
    }
  }
  const std::string printed = kolos::to_toml(config);
  std::string again;
  try {
    again = kolos::to_toml(kolos::parse_run_config(printed, "fuzz.toml"));
  } catch (const kolos::ConfigError& e) {
    std::fprintf(stderr, "the effective config does not read back:\n%s\n%s\n", printed.c_str(),
                 e.what());
    std::abort();
  }
  if (again != printed) {
    std::fprintf(stderr, "the effective config changes when read back:\n%s\n---\n%s\n",
                 printed.c_str(), again.c_str());
    std::abort();
  }
  return 0;
}
