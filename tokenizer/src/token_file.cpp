// `kolos data prepare --tokenizer`: documents to a token file (token_file.h).
//
// Documents are encoded a batch at a time (one per thread) and written in
// input order, so memory holds at most one batch of texts and ids.
// Atomicity as in modules/src/data/prepare.cpp: a temporary file, fsynced,
// renamed over the output, then the directory fsynced.
#include "kolos/tokenizer/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>

#include "kolos/core/error.h"
#include "kolos/core/posix_file.h"

namespace kolos::tokenizer {
namespace {

using posix::errno_text;
using posix::write_all;

std::string read_input(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw DataError("cannot read input " + path + ": " + errno_text(errno));
  }
  if (S_ISDIR(st.st_mode)) throw DataError("cannot read input " + path + ": Is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot read input " + path + ": " + errno_text(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw DataError("cannot read input " + path);
  return text.str();
}

// Appends `ids` to `bytes` as little-endian `width`-byte integers.
void append_ids(const std::vector<TokenId>& ids, int width, std::string* bytes) {
  const size_t at = bytes->size();
  bytes->resize(at + ids.size() * static_cast<size_t>(width));
  char* out = bytes->data() + at;
  for (const TokenId id : ids) {
    const auto v = static_cast<uint32_t>(id);
    for (int k = 0; k < width; ++k) *out++ = static_cast<char>((v >> (8 * k)) & 0xFF);
  }
}

}  // namespace

std::string token_dtype_for_vocab(int64_t vocab) { return vocab <= 65536 ? "uint16" : "uint32"; }

PreparedTokens prepare_token_file(const std::vector<std::string>& inputs, const std::string& output,
                                  const Tokenizer& tokenizer, int threads) {
  if (inputs.empty()) {
    throw DataError("kolos data prepare: no input files; give at least one FILE to tokenise");
  }
  if (output.empty()) {
    throw DataError("kolos data prepare: no output file; give one with -o out.bin");
  }
  const auto eos = tokenizer.eos_id();
  if (inputs.size() > 1 && !eos) {
    throw DataError("tokenizer " + tokenizer.path() +
                    " names no end-of-text token (eos), which goes between documents; add "
                    "\"eos_token\" to a tokenizer_config.json next to it (docs/tokenizers.md)");
  }
  PreparedTokens report;
  report.vocab = tokenizer.vocab_size();
  report.dtype = token_dtype_for_vocab(report.vocab);
  const int width = report.dtype == "uint16" ? 2 : 4;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min<int>(threads, static_cast<int>(inputs.size()));

  const std::string temp = output + ".tmp." + std::to_string(::getpid());
  posix::ScopedFd out(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (out.get() < 0) {
    throw DataError("cannot create " + temp + " (temporary file for " + output +
                    "): " + errno_text(errno));
  }
  posix::TempFileGuard guard(temp);

  const auto started = std::chrono::steady_clock::now();
  for (size_t first = 0; first < inputs.size(); first += static_cast<size_t>(threads)) {
    const size_t count = std::min(inputs.size() - first, static_cast<size_t>(threads));
    std::vector<std::vector<TokenId>> ids(count);
    std::vector<int64_t> sizes(count, 0);
    std::vector<std::exception_ptr> errors(count);
    auto work = [&](size_t k) {
      try {
        const std::string text = read_input(inputs[first + k]);
        sizes[k] = static_cast<int64_t>(text.size());
        ids[k] = tokenizer.encode(text);
      } catch (...) {
        errors[k] = std::current_exception();
      }
    };
    std::vector<std::thread> workers;
    for (size_t k = 1; k < count; ++k) workers.emplace_back(work, k);
    work(0);
    for (auto& w : workers) w.join();
    std::string bytes;
    for (size_t k = 0; k < count; ++k) {
      if (errors[k]) std::rethrow_exception(errors[k]);
      if (first + k > 0) {
        append_ids({*eos}, width, &bytes);
        ++report.tokens;
      }
      append_ids(ids[k], width, &bytes);
      report.tokens += static_cast<int64_t>(ids[k].size());
      report.input_bytes += sizes[k];
      ++report.documents;
    }
    write_all(out.get(), bytes.data(), bytes.size(), temp);
  }
  report.encode_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (report.tokens == 0) {
    throw DataError("kolos data prepare: the inputs give no tokens; nothing to write to " + output);
  }
  if (::fsync(out.get()) != 0) throw DataError("cannot fsync " + temp + ": " + errno_text(errno));
  if (const int err = out.close_checked(); err != 0) {
    throw DataError("cannot close " + temp + ": " + errno_text(err));
  }
  if (::rename(temp.c_str(), output.c_str()) != 0) {
    throw DataError("cannot rename " + temp + " to " + output + ": " + errno_text(errno));
  }
  guard.commit();
  // Best effort: the data is safe; some file systems refuse fsync on a directory.
  posix::sync_parent_directory(output);
  return report;
}

}  // namespace kolos::tokenizer
