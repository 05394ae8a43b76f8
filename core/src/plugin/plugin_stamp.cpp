#include "plugin_stamp.h"

#include <elf.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "kolos/core/plugin_abi.h"

namespace kolos {
namespace {

constexpr uint64_t kMaxStamp = 4096;

// Reads `size` bytes at `offset` of `in` (of `file_size` bytes) into `out`.
bool read_at(std::ifstream& in, uint64_t file_size, uint64_t offset, uint64_t size, void* out) {
  if (offset > file_size || size > file_size - offset) return false;
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(size));
  return static_cast<bool>(in);
}

}  // namespace

std::map<std::string, std::string> read_plugin_stamp(const std::string& path) {
  std::map<std::string, std::string> stamp;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return stamp;
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());

  Elf64_Ehdr header;
  if (!read_at(in, file_size, 0, sizeof header, &header)) return stamp;
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64 ||
      header.e_ident[EI_DATA] != ELFDATA2LSB || header.e_shentsize != sizeof(Elf64_Shdr) ||
      header.e_shnum == 0 || header.e_shstrndx >= header.e_shnum) {
    return stamp;  // not ours to read (or extended section numbering): load it
  }
  std::vector<Elf64_Shdr> sections(header.e_shnum);
  if (!read_at(in, file_size, header.e_shoff, sections.size() * sizeof(Elf64_Shdr),
               sections.data())) {
    return stamp;
  }
  const Elf64_Shdr& names = sections[header.e_shstrndx];
  const std::string wanted = KOLOS_PLUGIN_STAMP_SECTION;
  for (const Elf64_Shdr& section : sections) {
    // The section's name, compared in place: name offset + length + NUL.
    if (section.sh_name >= names.sh_size || names.sh_size - section.sh_name < wanted.size() + 1) {
      continue;
    }
    std::string name(wanted.size() + 1, '\0');
    if (!read_at(in, file_size, names.sh_offset + section.sh_name, name.size(), name.data()) ||
        name.compare(0, wanted.size(), wanted) != 0 || name.back() != '\0') {
      continue;
    }
    if (section.sh_type != SHT_PROGBITS || section.sh_size == 0 || section.sh_size > kMaxStamp) {
      return stamp;
    }
    std::string text(section.sh_size, '\0');
    if (!read_at(in, file_size, section.sh_offset, text.size(), text.data())) return stamp;
    text.resize(std::strlen(text.c_str()));  // up to the first NUL
    std::istringstream words(text);
    for (std::string word; words >> word;) {
      const auto eq = word.find('=');
      if (eq != std::string::npos) stamp[word.substr(0, eq)] = word.substr(eq + 1);
    }
    return stamp;
  }
  return stamp;
}

}  // namespace kolos
