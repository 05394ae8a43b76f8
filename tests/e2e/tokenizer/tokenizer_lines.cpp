// The kolos side of the tokenizer interop test (interop.py): encodes each
// line of a file (split on '\n', raw bytes, invalid UTF-8 included) and
// decodes the ids again, one JSON object per line on stdout:
//   {"ids": [...], "text": "..."}
// Usage: tokenizer_lines TOKENIZER INPUT [--no-special]
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kolos/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: tokenizer_lines TOKENIZER INPUT [--no-special]\n";
    return 2;
  }
  const bool special = !(argc > 3 && std::string(argv[3]) == "--no-special");
  try {
    const auto tokenizer = kolos::tokenizer::open_tokenizer(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) {
      std::cerr << "cannot read " << argv[2] << "\n";
      return 1;
    }
    std::ostringstream buffer;
    buffer << in.rdbuf();
    const std::string data = buffer.str();
    size_t start = 0;
    while (start < data.size()) {
      size_t end = data.find('\n', start);
      if (end == std::string::npos) end = data.size();
      const auto ids =
          tokenizer->encode(std::string_view(data).substr(start, end - start), special);
      nlohmann::json line;
      line["ids"] = ids;
      line["text"] = tokenizer->decode(ids);
      std::cout << line.dump() << "\n";
      start = end + 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "tokenizer_lines: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
