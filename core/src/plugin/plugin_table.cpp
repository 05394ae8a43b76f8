// format_plugin_table: what `kolos plugins` prints.
#include <algorithm>
#include <array>
#include <sstream>

#include "kolos/core/plugin_registry.h"

namespace kolos {

std::string format_plugin_table(const std::vector<PluginInfo>& plugins) {
  if (plugins.empty()) return "no plugins found\n";

  constexpr std::size_t kColumns = 5;
  using Row = std::array<std::string, kColumns>;
  const auto shown = [](const std::string& field) { return field.empty() ? "-" : field; };
  std::vector<Row> rows = {{"NAME", "ROLE", "KOLOS", "LIBTORCH", "PATH"}};
  for (const PluginInfo& plugin : plugins) {
    rows.push_back({shown(plugin.name), shown(plugin.role), shown(plugin.kolos_version),
                    shown(plugin.torch_version), plugin.path});
  }
  std::array<std::size_t, kColumns> width{};
  for (const Row& row : rows) {
    for (std::size_t c = 0; c < kColumns; ++c) width[c] = std::max(width[c], row[c].size());
  }

  std::ostringstream out;
  const auto print_row = [&](const Row& row) {
    for (std::size_t c = 0; c + 1 < kColumns; ++c) {
      out << row[c] << std::string(width[c] - row[c].size() + 2, ' ');
    }
    out << row[kColumns - 1] << '\n';
  };
  print_row(rows[0]);
  std::size_t usable = 0;
  for (std::size_t i = 0; i < plugins.size(); ++i) {
    const PluginInfo& plugin = plugins[i];
    print_row(rows[i + 1]);
    if (plugin.usable) {
      ++usable;
      if (!plugin.description.empty()) out << "    " << plugin.description << '\n';
    } else {
      out << "    refused: " << plugin.refusal << '\n';
    }
  }
  out << usable << " usable, " << plugins.size() - usable << " refused\n";
  return out.str();
}

}  // namespace kolos
