// A run's TOML text into a document, with `--set` overrides applied.
// Private to core/src/config (toml_input.cpp).
#pragma once

#include <string>
#include <vector>

#include <toml.hpp>

#include "document.h"

namespace kolos {

// Parses `text` (the file `name`) after checking what toml11 does not:
// UTF-8, nesting depth and 64-bit integers. Throws ConfigError, located.
toml::value parse_document(const std::string& text, const std::string& name);

// Writes each "section.key=value" of `overrides` into `doc` (the value
// parsed as TOML, else taken as a string) and returns them for the
// document's origins. Throws ConfigError naming the override.
std::vector<Override> apply_overrides(toml::value& doc, const std::vector<std::string>& overrides,
                                      const std::string& name);

}  // namespace kolos
