// open_tokenizer(): which reader a path needs.
#include "kolos/tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "kolos/core/error.h"

namespace kolos::tokenizer {
namespace {

enum class Kind { kMissing, kFile, kDirectory, kOther };

Kind stat_kind(const std::string& path, int* err) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *err = errno;
    return Kind::kMissing;
  }
  if (S_ISDIR(st.st_mode)) return Kind::kDirectory;
  if (S_ISREG(st.st_mode)) return Kind::kFile;
  return Kind::kOther;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path) {
  int err = 0;
  switch (stat_kind(path, &err)) {
    case Kind::kMissing:
      throw DataError("cannot open tokenizer " + path + ": " + std::strerror(err) +
                      "; expected a tokenizer.json, a tokenizer.model or a directory holding one");
    case Kind::kOther:
      throw DataError("tokenizer " + path +
                      " is not a regular file or directory; expected a tokenizer.json, a "
                      "tokenizer.model or a directory holding one");
    case Kind::kDirectory: {
      for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
        const std::string candidate = path + "/" + name;
        int ignored = 0;
        if (stat_kind(candidate, &ignored) == Kind::kFile) return open_tokenizer(candidate);
      }
      throw DataError("tokenizer directory " + path +
                      " holds neither tokenizer.json nor tokenizer.model");
    }
    case Kind::kFile:
      break;
  }
  if (ends_with(path, ".json")) return open_hf_tokenizer_json(path);
  return open_sentencepiece_model(path);
}

}  // namespace kolos::tokenizer
