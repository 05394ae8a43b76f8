// `kolos generate`: greedy or sampled continuations of prompts from a
// checkpoint (any layout) or a Hugging Face directory, streamed to stdout.
//
//   kolos generate CKPT --prompt TEXT | --prompt-ids 1,2,3 [--max-tokens N]
//                  [--tokenizer PATH] [CONFIG.toml] [--set inference.KEY=VALUE ...]
//                                       one rank, in this process
//   kolos generate CKPT ... -n RANKS    RANKS ranks through mpirun (the path
//                                       `kolos run` takes), tensor parallel (tp1d)
//
// Each --prompt / --prompt-ids is one request; they are served together
// (continuous batching). One request streams its output as it comes; with
// several, each request's line "[i] ..." is printed when it finishes. Text
// when a tokenizer is known (--tokenizer, inference.tokenizer, or the
// model directory's tokenizer.json / tokenizer.model), else token ids (and
// --ids asks for ids anyway). A summary goes to stderr. CONFIG.toml may
// hold [inference] (and [plugins]) only.
#include "generate_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "kolos/config.h"
#include "kolos/core/error.h"
#include "kolos/core/run_config.h"
#include "kolos/core/runtime.h"
#include "kolos/core/settings.h"
#include "kolos/inference/config.h"
#include "kolos/inference/engine.h"
#include "kolos/tokenizer/tokenizer.h"
#include "launch.h"

namespace kolos::cli {
namespace {

constexpr const char* kGenerateUsage =
    R"(usage: kolos generate CKPT (--prompt TEXT | --prompt-ids IDS)... [options] [CONFIG.toml]

  CKPT                     a kolos checkpoint (step-N directory, or a root whose `latest` names one,
                           saved under any layout) or a Hugging Face directory (config.json and
                           safetensors: GPT-2, LLaMA)
  --prompt TEXT            a prompt as text (needs a tokenizer); repeat for several requests
  --prompt-ids IDS         a prompt as token ids, comma- or space-separated: 1,2,3; repeatable
  --tokenizer PATH         tokenizer.json or tokenizer.model (inference.tokenizer); default: the
                           model directory's own
  --ids                    print token ids even when a tokenizer is known
  --max-tokens N           new tokens per request at most (inference.max_tokens)
  -n, --np RANKS           run on RANKS ranks through mpirun, the model tensor parallel over them
  --mpirun PATH            the mpirun to use with -n
  --set inference.KEY=V    override a key of [inference] (docs/inference.md lists them)
  CONFIG.toml              a file with an [inference] section (and [plugins] path)

Requests are served together (continuous batching). One request streams its output on one line;
with several, each prints "[i] ..." when it finishes. A summary line goes to stderr.
)";

struct Prompt {
  bool ids = false;  // --prompt-ids (else --prompt)
  std::string value;
};

struct Options {
  std::string checkpoint;
  std::string config;
  std::vector<Prompt> prompts;
  std::vector<std::string> overrides;
  std::string max_tokens;
  std::string tokenizer;
  bool print_ids = false;
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
    if (is(a, "--prompt-ids") || is(a, "--prompt")) {
      const bool ids = is(a, "--prompt-ids");
      o.prompts.push_back(Prompt{ids, value(i, ids ? "--prompt-ids" : "--prompt")});
      o.forwarded.insert(o.forwarded.end(),
                         {ids ? "--prompt-ids" : "--prompt", o.prompts.back().value});
    } else if (is(a, "--max-tokens")) {
      o.max_tokens = value(i, "--max-tokens");
      o.forwarded.insert(o.forwarded.end(), {"--max-tokens", o.max_tokens});
    } else if (is(a, "--tokenizer")) {
      o.tokenizer = value(i, "--tokenizer");
      o.forwarded.insert(o.forwarded.end(), {"--tokenizer", o.tokenizer});
    } else if (a == "--ids") {
      o.print_ids = true;
      o.forwarded.push_back(a);
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
  if (o.prompts.empty()) {
    throw UsageError("kolos generate: no prompt; give --prompt TEXT or --prompt-ids IDS");
  }
  return o;
}

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
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

// The command's configuration: [inference] from CONFIG.toml, --max-tokens,
// --tokenizer and --set.
RunConfig command_config(const Options& o) {
  std::vector<std::string> overrides;
  if (!o.max_tokens.empty()) overrides.push_back("inference.max_tokens=" + o.max_tokens);
  if (!o.tokenizer.empty()) overrides.push_back("inference.tokenizer=" + quote_toml(o.tokenizer));
  overrides.insert(overrides.end(), o.overrides.begin(), o.overrides.end());
  return inference_cli::command_config(o.config, overrides, "kolos generate");
}

int launch(const Options& o) {
  inference::read_inference_config(command_config(o));  // a typo fails before any rank starts
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

// One request's text output: the decoded tokens, what is printed of it, and
// a stop string's end of it.
struct TextOutput {
  std::string text;
  size_t printed = 0;
  bool stopped = false;
};

}  // namespace

namespace inference_cli {

RunConfig command_config(const std::string& config_path, const std::vector<std::string>& overrides,
                         const std::string& command) {
  RunConfig config = config_path.empty() ? parse_run_config("", command, overrides)
                                         : load_run_config(config_path, overrides);
  for (const char* name : {"model", "data", "optim", "train", "parallel", "log", "checkpoint",
                           "runtime", "memory", "planner"}) {
    const ConfigSection section = config.section(name);
    if (section.present()) {
      section.fail_here(std::string("[") + name + "]: " + command +
                        " reads only [inference] and [plugins]; the model and its shape come "
                        "from the checkpoint");
    }
  }
  return config;
}

// inference.tokenizer, or the model directory's own tokenizer file.
std::unique_ptr<tokenizer::Tokenizer> open_tokenizer(const inference::InferenceConfig& settings,
                                                     const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::string path = settings.tokenizer;
  if (path.empty()) {
    for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
      if (fs::is_regular_file(fs::path(model_dir) / name)) {
        path = (fs::path(model_dir) / name).string();
        break;
      }
    }
  }
  if (path.empty()) return nullptr;
  return tokenizer::open_tokenizer(path);
}

// The prefix of `text` that is safe to print while more tokens may come:
// not a trailing U+FFFD (a character cut between tokens decodes as one
// until its next token arrives) nor the last `hold` bytes (a stop string
// may start there), cut at a character boundary.
size_t stable_prefix(const std::string& text, size_t hold) {
  size_t end = text.size();
  static const std::string kReplacement = "\xEF\xBF\xBD";
  while (end >= 3 && text.compare(end - 3, 3, kReplacement) == 0) end -= 3;
  end = end > hold ? end - hold : 0;
  while (end > 0 && end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) {
    --end;
  }
  return end;
}

}  // namespace inference_cli

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
    RunConfig config;
    inference::InferenceConfig settings;
    agreed(*runtime.world(), [&] {
      config = command_config(o);
      settings = inference::read_inference_config(config);
      if (!settings.chat_template.empty()) {
        throw ConfigError(
            "inference.chat_template: kolos generate continues prompts as given; the chat "
            "template is kolos serve's (/v1/chat/completions)");
      }
    });

    inference::InferenceEngine engine(o.checkpoint, settings, runtime.world(), config.plugins.path);
    // Rank 0 opens the tokenizer and checks the requests (prompt length,
    // vocabulary, sampling); the verdict is agreed before the others wait
    // for steps.
    // The requests are checked on the driver; a bad one is named by its
    // index and flag, then agreed like any set-up error.
    std::string error;
    int kind = 0;
    std::vector<int64_t> ids;
    std::unique_ptr<tokenizer::Tokenizer> tok;
    if (engine.is_driver()) {
      std::fprintf(stderr, "kolos: %s\n", engine.describe().c_str());
      try {
        tok = inference_cli::open_tokenizer(settings, o.checkpoint);
        if (tok && tok->vocab_size() > engine.model().vocab) {
          throw ConfigError("inference.tokenizer: " + tok->path() + " has " +
                            std::to_string(tok->vocab_size()) + " ids, more than the model's " +
                            std::to_string(engine.model().vocab) + " (model.vocab)");
        }
        if (!tok && !settings.stop.empty()) {
          throw ConfigError(
              "inference.stop: stop strings need a tokenizer (--tokenizer PATH or "
              "inference.tokenizer); stop_token_ids work without one");
        }
        inference::SamplingParams sampling = settings.sampling();
        if (tok && !settings.ignore_eos && tok->eos_id()) {
          sampling.stop_token_ids.push_back(*tok->eos_id());
        }
        for (size_t i = 0; i < o.prompts.size() && error.empty(); ++i) {
          const Prompt& p = o.prompts[i];
          try {
            std::vector<int64_t> prompt;
            if (p.ids) {
              prompt = parse_ids(p.value);
            } else if (!tok) {
              throw ConfigError(
                  "--prompt TEXT needs a tokenizer: give --tokenizer PATH (tokenizer.json or "
                  "tokenizer.model), set inference.tokenizer, or give the prompt as ids with "
                  "--prompt-ids");
            } else {
              for (const auto id : tok->encode(p.value)) prompt.push_back(id);
            }
            ids.push_back(engine.scheduler().add_request(inference::Request{prompt, sampling}));
          } catch (const Error& e) {
            error = "request " + std::to_string(i) + " (" +
                    (p.ids ? "--prompt-ids " : "--prompt ") + p.value + "): " + e.what();
            kind = static_cast<int>(e.kind());
          }
        }
      } catch (const Error& e) {
        if (error.empty()) {
          error = e.what();
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
    const bool text = tok != nullptr && !o.print_ids;
    const bool streaming = ids.size() == 1;
    size_t hold = 0;
    for (const auto& s : settings.stop) hold = std::max(hold, s.size() - 1);
    std::map<int64_t, TextOutput> outputs;
    int64_t tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    engine.run([&](const inference::TokenEvent& e) {
      ++tokens;
      const std::vector<int64_t>& generated = scheduler.generated(e.request);
      bool finished = e.finished;
      if (!text) {
        if (streaming) {
          std::printf("%s%lld", generated.size() == 1 ? "" : " ", static_cast<long long>(e.token));
          if (finished) std::printf("\n");
        } else if (finished) {
          std::printf("[%lld] %s\n", static_cast<long long>(e.request),
                      join_ids(generated).c_str());
        }
        std::fflush(stdout);
        return;
      }
      TextOutput& out = outputs[e.request];
      if (out.stopped) return;
      std::vector<tokenizer::TokenId> token_ids(generated.begin(), generated.end());
      out.text = tok->decode(token_ids);
      size_t cut = std::string::npos;
      for (const auto& s : settings.stop) cut = std::min(cut, out.text.find(s));
      if (cut != std::string::npos) {
        out.text.resize(cut);
        out.stopped = true;
        if (!finished) scheduler.cancel(e.request);  // its blocks are free now
        finished = true;
      }
      if (streaming) {
        const size_t end =
            finished ? out.text.size() : inference_cli::stable_prefix(out.text, hold);
        if (end > out.printed) {
          std::fwrite(out.text.data() + out.printed, 1, end - out.printed, stdout);
          out.printed = end;
        }
        if (finished) std::printf("\n");
      } else if (finished) {
        std::printf("[%lld] %s\n", static_cast<long long>(e.request), out.text.c_str());
      }
      std::fflush(stdout);
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const inference::InferenceEngine::StepTimes& times = engine.step_times();
    std::fprintf(stderr,
                 "kolos: generated %lld tokens for %zu request%s in %.2f s (%.1f tokens/s); "
                 "%lld steps: forward %.2f s (%lld decoding steps: %.2f s), sampling %.3f s; "
                 "preemptions %lld; KV blocks in use at the end: %lld of %lld\n",
                 static_cast<long long>(tokens), ids.size(), ids.size() == 1 ? "" : "s", seconds,
                 seconds > 0 ? double(tokens) / seconds : 0.0, static_cast<long long>(times.steps),
                 times.forward_s, static_cast<long long>(times.decode_steps),
                 times.decode_forward_s, times.sample_s,
                 static_cast<long long>(scheduler.preemptions()),
                 static_cast<long long>(scheduler.allocator().num_used()),
                 static_cast<long long>(scheduler.allocator().num_blocks()));
    return 0;
  });
}

}  // namespace kolos::cli
