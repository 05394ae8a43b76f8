// The chunks plugin's settings (chunk_settings.h).
#include "chunk_settings.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "kolos/core/format.h"
#include "kolos/core/settings.h"
#include "kolos/memory/chunk_layout.h"

namespace kolos::chunks {
namespace {

std::string in_unit(double x) { return x >= 0 && x <= 1 ? "" : "in [0, 1]"; }

const SettingsTable<ChunkSettings>& settings_table() {
  static const auto t =
      SettingsTable<ChunkSettings>("memory")
          .choice("placement", &ChunkSettings::placement, {"auto", "static"}, "placement policy")
          .bytes("compute_budget", &ChunkSettings::compute_budget)
          .choice("offload", &ChunkSettings::offload, {"host", "nvme"}, "lower tier")
          .string("nvme_dir", &ChunkSettings::nvme_dir)
          .string("chunk_size", &ChunkSettings::chunk_size)
          .number("param_fraction", &ChunkSettings::param_fraction, in_unit)
          .number("grad_fraction", &ChunkSettings::grad_fraction, in_unit)
          .number("optim_fraction", &ChunkSettings::optim_fraction, in_unit)
          .integer("prefetch", &ChunkSettings::prefetch, 0, 16)
          .integer("io_threads", &ChunkSettings::io_threads, 1, 64);
  return t;
}

}  // namespace

ChunkSettings read_chunk_settings(const PluginContext& context) {
  const ConfigSection& s = context.section;
  ChunkSettings c;
  settings_table().read(s, c, context.core_keys, context.owner);
  if (c.compute_budget <= 0) {
    s.fail_here(context.owner +
                " needs memory.compute_budget, the bytes of chunks the compute tier may hold "
                "(for example compute_budget = \"2GiB\").");
  }
  if (c.chunk_size != "auto") {
    int64_t bytes = 0;
    try {
      bytes = parse_byte_size(c.chunk_size);
    } catch (const std::invalid_argument& e) {
      s.fail("chunk_size",
             quote_toml(c.chunk_size) + ": " + e.what() + "; give \"auto\" or a size.");
    }
    if (bytes <= 0 || bytes % memory::kDirectIoAlignment != 0) {
      s.fail(
          "chunk_size",
          quote_toml(c.chunk_size) + " is not a positive multiple of " +
              std::to_string(memory::kDirectIoAlignment) +
              " bytes (chunks move whole, with direct I/O); for example " +
              quote_toml(std::to_string(std::max<int64_t>(1, bytes / memory::kDirectIoAlignment) *
                                        memory::kDirectIoAlignment) +
                         "B") +
              ".");
    }
    c.chunk_bytes = bytes;
  }
  if (c.offload == "nvme") {
    if (c.nvme_dir.empty()) {
      s.fail("offload", "\"nvme\" needs memory.nvme_dir, a directory on the drive to use.");
    }
    struct stat st {};
    if (::stat(c.nvme_dir.c_str(), &st) != 0) {
      s.fail("nvme_dir", quote_toml(c.nvme_dir) + ": " + std::strerror(errno) +
                             "; give an existing directory.");
    }
    if (!S_ISDIR(st.st_mode)) {
      s.fail("nvme_dir", quote_toml(c.nvme_dir) + " is not a directory.");
    }
  } else if (s.has("nvme_dir")) {
    s.fail_at_any({"nvme_dir", "offload"},
                  "memory.nvme_dir is set but memory.offload = \"host\" keeps the chunks out "
                  "of the compute tier in host memory; set offload = \"nvme\" or remove "
                  "nvme_dir.");
  }
  const bool is_static = c.placement == "static";
  for (const char* key : {"param_fraction", "grad_fraction", "optim_fraction"}) {
    if (!is_static && s.has(key)) {
      s.fail(key,
             "applies to placement = \"static\" only; the placement is \"" + c.placement + "\".");
    }
  }
  if (is_static && s.has("prefetch")) {
    s.fail("prefetch",
           "applies to placement = \"auto\" only (static placement loads a chunk for the step "
           "that needs it).");
  }
  if (c.offload != "nvme" && s.has("io_threads")) {
    s.fail("io_threads", "applies to offload = \"nvme\" only.");
  }
  return c;
}

}  // namespace kolos::chunks
