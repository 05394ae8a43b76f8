// `kolos generate`: greedy or sampled continuations of prompts from a
// checkpoint (any layout) or a Hugging Face directory, streamed to stdout.
//
//   kolos generate CKPT --prompt-ids 1,2,3 [--max-tokens N] [CONFIG.toml]
//                  [--set inference.KEY=VALUE ...]        one rank, in this process
//   kolos generate CKPT ... -n RANKS                      RANKS ranks through mpirun
//                                                         (the path `kolos run` takes),
//                                                         tensor parallel (tp1d)
//
// Each --prompt-ids is one request; they are served together (continuous
// batching). One request: its tokens are printed as they come, on one line.
// Several: each request's line "[i] ids..." when it finishes. A summary goes
// to stderr. CONFIG.toml may hold [inference] (and [plugins]) only.
#include "generate_command.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

#include "kolos/config.h"
#include "kolos/core/error.h"
#include "kolos/core/run_config.h"
#include "kolos/core/runtime.h"
#include "kolos/core/settings.h"
#include "kolos/inference/config.h"
#include "kolos/inference/engine.h"
#include "launch.h"

namespace kolos::cli {
namespace {

constexpr const char* kGenerateUsage =
    R"(usage: kolos generate CKPT (--prompt-ids IDS)... [options] [CONFIG.toml]

  CKPT                     a kolos checkpoint (step-N directory, or a root whose `latest` names one,
                           saved under any layout) or a Hugging Face directory (config.json and
                           safetensors: GPT-2, LLaMA)
  --prompt-ids IDS         a prompt as token ids, comma- or space-separated: 1,2,3; repeat the option
                           for several requests, served together (continuous batching)
  --prompt TEXT            a prompt as text (needs a tokenizer: not available in this version)
  --max-tokens N           new tokens per request at most (inference.max_tokens)
  -n, --np RANKS           run on RANKS ranks through mpirun, the model tensor parallel over them
  --mpirun PATH            the mpirun to use with -n
  --set inference.KEY=V    override a key of [inference] (docs/inference.md lists them)
  CONFIG.toml              a file with an [inference] section (and [plugins] path)

Output: one request's new token ids stream to stdout on one line; with several requests each
prints "[i] ids..." when it finishes. A summary line goes to stderr.
)";

struct Options {
  std::string checkpoint;
  std::string config;
  std::vector<std::string> prompt_ids;
  std::vector<std::string> prompts;
  std::vector<std::string> overrides;
  std::string max_tokens;
  int ranks = 0;
  std::string mpirun = KOLOS_MPIEXEC;
  std::vector<std::string> forwarded;  // what every rank gets (no -n, no --mpirun)
};

Options parse_options(const std::vector<std::string>& args) {
  Options o;
  auto value = [&](size_t& i, const std::string& name) -> std::string {
    const std::string& a = args[i];
    const auto eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) return a.substr(eq + 1);
    if (i + 1 >= args.size()) throw UsageError("kolos generate: " + name + " needs a value");
    return args[++i];
  };
  auto is = [](const std::string& a, const std::string& name) {
    return a == name || a.rfind(name + "=", 0) == 0;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string a = args[i];
    if (is(a, "--prompt-ids")) {
      o.prompt_ids.push_back(value(i, "--prompt-ids"));
      o.forwarded.insert(o.forwarded.end(), {"--prompt-ids", o.prompt_ids.back()});
    } else if (is(a, "--prompt")) {
      o.prompts.push_back(value(i, "--prompt"));
      o.forwarded.insert(o.forwarded.end(), {"--prompt", o.prompts.back()});
    } else if (is(a, "--max-tokens")) {
      o.max_tokens = value(i, "--max-tokens");
      o.forwarded.insert(o.forwarded.end(), {"--max-tokens", o.max_tokens});
    } else if (is(a, "--set")) {
      o.overrides.push_back(value(i, "--set"));
    } else if (a == "-n" || is(a, "--np")) {
      const std::string n = value(i, "-n");
      try {
        size_t used = 0;
        o.ranks = std::stoi(n, &used);
        if (used != n.size() || o.ranks < 1) throw std::invalid_argument(n);
      } catch (const std::exception&) {
        throw UsageError("kolos generate: -n `" + n + "`: expected a number of ranks >= 1");
      }
    } else if (is(a, "--mpirun")) {
      o.mpirun = value(i, "--mpirun");
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError("kolos generate: unknown option `" + a + "` (see `kolos generate --help`)");
    } else if (o.checkpoint.empty()) {
      o.checkpoint = a;
    } else if (o.config.empty()) {
      o.config = a;
      o.forwarded.push_back(a);
    } else {
      throw UsageError("kolos generate: unexpected argument `" + a + "`");
    }
  }
  if (o.checkpoint.empty()) {
    throw UsageError("kolos generate: missing CKPT (see `kolos generate --help`)");
  }
  if (o.prompt_ids.empty() && o.prompts.empty()) {
    throw UsageError("kolos generate: no prompt; give --prompt-ids IDS (or --prompt TEXT)");
  }
  if (!o.prompts.empty()) {
    throw UsageError(
        "kolos generate: --prompt TEXT needs a tokenizer, which this version of `kolos generate` "
        "does not load yet; give the prompt as token ids with --prompt-ids 1,2,3");
  }
  return o;
}

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::string item;
  std::istringstream in(text);
  auto add = [&](const std::string& token) {
    if (token.empty()) return;
    try {
      size_t used = 0;
      const long long id = std::stoll(token, &used);
      if (used != token.size()) throw std::invalid_argument(token);
      ids.push_back(id);
    } catch (const std::exception&) {
      throw UsageError("kolos generate: --prompt-ids `" + text + "`: `" + token +
                       "` is not a token id (expected integers separated by commas or spaces)");
    }
  };
  std::string token;
  for (const char c : text) {
    if (c == ',' || c == ' ' || c == '\t' || c == '\n') {
      add(token);
      token.clear();
    } else {
      token += c;
    }
  }
  add(token);
  return ids;
}

// The command's configuration: [inference] from CONFIG.toml, --max-tokens
// and --set; every other section is refused at its line.
RunConfig command_config(const Options& o) {
  std::vector<std::string> overrides;
  if (!o.max_tokens.empty()) overrides.push_back("inference.max_tokens=" + o.max_tokens);
  overrides.insert(overrides.end(), o.overrides.begin(), o.overrides.end());
  RunConfig config = o.config.empty() ? parse_run_config("", "kolos generate", overrides)
                                      : load_run_config(o.config, overrides);
  for (const char* name : {"model", "data", "optim", "train", "parallel", "log", "checkpoint",
                           "runtime", "memory", "planner"}) {
    const ConfigSection section = config.section(name);
    if (section.present()) {
      section.fail_here(std::string("[") + name +
                        "]: kolos generate reads only [inference] and [plugins]; the model and "
                        "its shape come from the checkpoint");
    }
  }
  return config;
}

int launch(const Options& o) {
  command_config(o);  // a typo fails before any rank starts
  LaunchOptions launch;
  launch.ranks = o.ranks;
  launch.config = o.checkpoint;
  launch.command = "generate";
  launch.extra = o.forwarded;
  launch.overrides = o.overrides;
  launch.mpirun = o.mpirun;
  return exec_mpirun(launch);
}

std::string join_ids(const std::vector<int64_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
  return out;
}

}  // namespace

int generate_command(const std::vector<std::string>& args, int argc, char** argv) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << kGenerateUsage;
      return 0;
    }
  }
  const Options o = parse_options(args);
  if (o.ranks > 1) return launch(o);

  Runtime runtime(&argc, &argv);
  return run_guarded(runtime, [&] {
    std::string error;
    int kind = 0;
    RunConfig config;
    inference::InferenceConfig settings;
    try {
      config = command_config(o);
      settings = inference::read_inference_config(config);
    } catch (const Error& e) {
      error = e.what();
      kind = static_cast<int>(e.kind());
    }
    detail::agree_on_error(*runtime.world(), error, kind);

    inference::InferenceEngine engine(o.checkpoint, settings, runtime.world(), config.plugins.path);
    // Requests are checked on rank 0 (prompt length, vocabulary, sampling);
    // the verdict is agreed before the others wait for steps.
    error.clear();
    std::vector<int64_t> ids;
    if (engine.is_driver()) {
      std::fprintf(stderr, "kolos: %s\n", engine.describe().c_str());
      for (size_t i = 0; i < o.prompt_ids.size() && error.empty(); ++i) {
        try {
          ids.push_back(engine.scheduler().add_request(
              inference::Request{parse_ids(o.prompt_ids[i]), settings.sampling()}));
        } catch (const Error& e) {
          error = "request " + std::to_string(i) + " (--prompt-ids " + o.prompt_ids[i] +
                  "): " + e.what();
          kind = static_cast<int>(e.kind());
        }
      }
    }
    detail::agree_on_error(*runtime.world(), error, kind);
    if (!engine.is_driver()) {
      engine.follow();
      return 0;
    }
    inference::Scheduler& scheduler = engine.scheduler();
    const bool streaming = ids.size() == 1;
    int64_t tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    engine.run([&](const inference::TokenEvent& e) {
      ++tokens;
      if (streaming) {
        std::printf("%s%lld", scheduler.generated(e.request).size() == 1 ? "" : " ",
                    static_cast<long long>(e.token));
        if (e.finished) std::printf("\n");
        std::fflush(stdout);
      } else if (e.finished) {
        std::printf("[%lld] %s\n", static_cast<long long>(e.request),
                    join_ids(scheduler.generated(e.request)).c_str());
        std::fflush(stdout);
      }
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr,
                 "kolos: generated %lld tokens for %zu request%s in %.2f s (%.1f tokens/s); "
                 "preemptions %lld; KV blocks in use at the end: %lld of %lld\n",
                 static_cast<long long>(tokens), ids.size(), ids.size() == 1 ? "" : "s", seconds,
                 seconds > 0 ? double(tokens) / seconds : 0.0,
                 static_cast<long long>(scheduler.preemptions()),
                 static_cast<long long>(scheduler.allocator().num_used()),
                 static_cast<long long>(scheduler.allocator().num_blocks()));
    return 0;
  });
}

}  // namespace kolos::cli
