// Human-readable numbers for progress lines and summaries.
#pragma once

#include <string>

namespace kolos::detail {

std::string format_duration(double seconds);  // "1:02:03" / "2:03"
std::string format_count(double value);       // "12.3k", "4.50M"
std::string format_bytes(double bytes);       // "512.0 MiB"

}  // namespace kolos::detail
