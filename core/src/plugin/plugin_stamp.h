// The build stamp of a plugin file (plugin_abi.h: KOLOS_PLUGIN_STAMP), read
// from its ELF section without loading the file.
//
// Private to core/src/plugin. Every offset and size taken from the file is
// checked against the file's size before it is used; the stamp is at most
// 4 KiB.
#pragma once

#include <map>
#include <string>

namespace kolos {

// key -> value of the stamp's "key=value" words ("kolos", "torch"). Empty
// when the file is not a 64-bit little-endian ELF file or has no stamp
// section (the caller then loads it and reads the descriptor).
std::map<std::string, std::string> read_plugin_stamp(const std::string& path);

}  // namespace kolos
