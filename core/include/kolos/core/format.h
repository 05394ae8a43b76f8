// Human-readable numbers for progress lines and summaries, and strings
// quoted for JSON and TOML.
#pragma once

#include <string>

namespace kolos::detail {

std::string format_duration(double seconds);  // "1:02:03" / "2:03"
std::string format_count(double value);       // "12.3k", "4.50M"
std::string format_bytes(double bytes);       // "512.0 MiB"

// `s` in double quotes with the escapes JSON strings and TOML basic strings
// share: \" \\ \b \t \n \f \r, and \u00XX for the other control
// characters; DEL too when `escape_delete` (TOML must, JSON need not).
std::string quote_escaped(const std::string& s, bool escape_delete);

}  // namespace kolos::detail
