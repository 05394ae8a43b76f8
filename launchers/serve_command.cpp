// `kolos serve`: /v1/completions and /v1/chat/completions (plain and
// server-sent events, optional logprobs), /v1/chat/render, /v1/models,
// /tokenize, /detokenize, /health and /metrics over the inference engine, on
// rank 0. Chat prompts are rendered with the model's chat template
// (kolos/tokenizer/chat_template.h).
//
// Threads on rank 0: cpp-httplib's handler threads parse and check a
// request, hand it to the engine loop through an inbox and wait on the
// request's own channel; the main thread runs the engine loop (it alone
// touches the scheduler and the engine): it admits queued requests, runs a
// step, and delivers each sampled token to its request's channel. A client
// that goes away mid-stream cancels its request (its blocks are freed at
// once). With several ranks the others follow the steps; between requests
// rank 0 sends an idle step every half second, so that none waits in one
// broadcast past the communication timeout. SIGTERM or SIGINT: stop
// accepting, finish what is in flight, release the other ranks, exit 0.
//
// This file holds the command: its options, the relaunch through mpirun
// with -n, the set-up on every rank, and rank 0's threads. The server's
// parts: serve_server.h (its state; requests, chat template, engine loop,
// metrics), serve_routes.h (the HTTP routes), serve_responses.h (the JSON
// answers).
#include "serve_command.h"

#if !defined(KOLOS_WITH_HTTPLIB)
#include "kolos/core/error.h"

namespace kolos::cli {
int serve_command(const std::vector<std::string>&, int, char**) {
  throw UsageError(
      "kolos serve: this kolos was built without cpp-httplib; install libcpp-httplib-dev "
      "(scripts/install-deps.sh) and configure again");
}
}  // namespace kolos::cli
#else
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "generate_command.h"
#include "kolos/config.h"
#include "kolos/core/error.h"
#include "kolos/core/runtime.h"
#include "kolos/core/settings.h"
#include "kolos/inference/engine.h"
#include "launch.h"
#include "serve_routes.h"
#include "serve_server.h"

namespace kolos::cli {
namespace {

using serve::g_stop;

constexpr const char* kServeUsage =
    R"(usage: kolos serve CKPT [--host HOST] [--port PORT] [options] [CONFIG.toml]

  CKPT                     a kolos checkpoint or a Hugging Face directory (as kolos generate)
  --host HOST              address to listen on (default 127.0.0.1)
  --port PORT              port (default 8000; 0: any free port, printed on stderr)
  --model NAME             the model name requests may give (default: CKPT's directory name)
  --max-queue N            requests waiting at most (not yet in a step, or preempted); more are
                           refused with 429 (default 256)
  --tokenizer PATH         tokenizer.json or tokenizer.model (inference.tokenizer)
  --chat-template PATH     a Jinja2 chat template file (inference.chat_template; default: the
                           tokenizer_config.json's chat_template next to the tokenizer)
  -n, --np RANKS           run on RANKS ranks through mpirun (tensor parallel, pipeline stages)
  --mpirun PATH            the mpirun to use with -n
  --set inference.KEY=V    override a key of [inference]
  CONFIG.toml              a file with an [inference] section (and [plugins] path)

Endpoints: POST /v1/completions (OpenAI's fields: prompt, max_tokens, temperature, top_p, top_k,
min_p, presence_penalty, repetition_penalty, seed, stop, stream, logprobs), POST
/v1/chat/completions (messages, the same fields, logprobs and top_logprobs), POST /v1/chat/render
{"messages"} (the rendered prompt), GET /v1/models, POST /tokenize {"prompt"}, POST /detokenize
{"tokens"}, GET /health, GET /metrics.
SIGTERM stops accepting, finishes the requests in flight and exits 0.
)";

void on_serve_stop_signal(int) { g_stop.store(true); }

}  // namespace

int serve_command(const std::vector<std::string>& args, int argc, char** argv) {
  std::string checkpoint, config_path, host = "127.0.0.1", model_name, tokenizer_path,
                                       chat_template_path;
  std::string mpirun = KOLOS_MPIEXEC;
  int port = 8000, ranks = 0;
  int64_t max_queue = 256;
  std::vector<std::string> overrides, forwarded;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UsageError("kolos serve: " + a + " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kServeUsage;
      return 0;
    } else if (a == "--host") {
      host = value();
      forwarded.insert(forwarded.end(), {"--host", host});
    } else if (a == "--port") {
      const std::string v = value();
      port = std::atoi(v.c_str());
      if (port < 0 || port > 65535 || (port == 0 && v != "0")) {
        throw UsageError("kolos serve: --port `" + v + "`: expected 0..65535");
      }
      forwarded.insert(forwarded.end(), {"--port", v});
    } else if (a == "--model") {
      model_name = value();
      forwarded.insert(forwarded.end(), {"--model", model_name});
    } else if (a == "--max-queue") {
      const std::string v = value();
      max_queue = std::atoll(v.c_str());
      if (max_queue < 1) throw UsageError("kolos serve: --max-queue `" + v + "`: expected >= 1");
      forwarded.insert(forwarded.end(), {"--max-queue", v});
    } else if (a == "--tokenizer") {
      tokenizer_path = value();
      forwarded.insert(forwarded.end(), {"--tokenizer", tokenizer_path});
    } else if (a == "--chat-template") {
      chat_template_path = value();
      forwarded.insert(forwarded.end(), {"--chat-template", chat_template_path});
    } else if (a == "--set") {
      overrides.push_back(value());
    } else if (a == "-n" || a == "--np") {
      ranks = std::atoi(value().c_str());
      if (ranks < 1) throw UsageError("kolos serve: -n expects a number of ranks >= 1");
    } else if (a == "--mpirun") {
      mpirun = value();
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError("kolos serve: unknown option `" + a + "` (see `kolos serve --help`)");
    } else if (checkpoint.empty()) {
      checkpoint = a;
    } else if (config_path.empty()) {
      config_path = a;
      forwarded.push_back(a);
    } else {
      throw UsageError("kolos serve: unexpected argument `" + a + "`");
    }
  }
  if (checkpoint.empty()) throw UsageError("kolos serve: missing CKPT (see `kolos serve --help`)");
  if (model_name.empty()) {
    std::string trimmed = checkpoint;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    model_name = trimmed.substr(trimmed.find_last_of('/') + 1);
  }
  std::vector<std::string> all_overrides;
  if (!tokenizer_path.empty())
    all_overrides.push_back("inference.tokenizer=" + quote_toml(tokenizer_path));
  if (!chat_template_path.empty())
    all_overrides.push_back("inference.chat_template=" + quote_toml(chat_template_path));
  all_overrides.insert(all_overrides.end(), overrides.begin(), overrides.end());
  if (ranks > 1) {
    inference::read_inference_config(
        inference_cli::command_config(config_path, all_overrides, "kolos serve"));
    LaunchOptions launch;
    launch.ranks = ranks;
    launch.config = checkpoint;
    launch.command = "serve";
    launch.extra = forwarded;
    launch.overrides = overrides;
    launch.mpirun = mpirun;
    return exec_mpirun(launch);
  }

  std::signal(SIGTERM, on_serve_stop_signal);
  std::signal(SIGINT, on_serve_stop_signal);
  Runtime runtime(&argc, &argv);
  return run_guarded(runtime, [&] {
    RunConfig config;
    inference::InferenceConfig settings;
    agreed(*runtime.world(), [&] {
      config = inference_cli::command_config(config_path, all_overrides, "kolos serve");
      settings = inference::read_inference_config(config);
    });
    inference::InferenceEngine engine(checkpoint, settings, runtime.world(), config.plugins.path);
    serve::Server server{engine, settings, nullptr, model_name, max_queue};
    httplib::Server http;
    // A request holds its handler thread until it ends, so the pool has one
    // for every request the engine may run (max_seqs) or queue
    // (--max-queue), one more to answer the next with 429, and a few for
    // /health and /metrics. cpp-httplib's default, max(8, cores - 1),
    // would leave the ninth concurrent request unread in the listen backlog.
    const auto handlers = static_cast<size_t>(settings.max_seqs + max_queue + 4);
    http.new_task_queue = [handlers] { return new httplib::ThreadPool(handlers); };
    int bound = -1;
    agreed(*runtime.world(), [&] {
      if (!engine.is_driver()) return;
      server.tok = inference_cli::open_tokenizer(settings, checkpoint);
      serve::load_chat_template(server, settings);
      bound = port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
      if (bound < 0) {
        throw UsageError("kolos serve: cannot listen on " + host + ":" + std::to_string(port));
      }
    });
    if (!engine.is_driver()) {
      engine.follow();
      return 0;
    }

    serve::add_routes(http, server);
    if (server.chat) {
      std::string ends;
      for (const int64_t t : server.turn_end_ids) {
        ends += " " + server.tok->id_to_token(static_cast<tokenizer::TokenId>(t)).value_or("?");
      }
      std::fprintf(stderr, "kolos: chat template %s; a turn ends at eos%s\n",
                   server.chat->origin().c_str(), ends.c_str());
    }
    std::fprintf(stderr, "kolos: %s\nkolos: serving on http://%s:%d (model `%s`)\n",
                 engine.describe().c_str(), host.c_str(), bound, model_name.c_str());
    std::thread listener([&] { http.listen_after_bind(); });
    std::thread watcher([&] {
      while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      http.stop();  // no new connections; the loop finishes what is in flight
      server.inbox_changed.notify_all();
    });
    server.loop();
    watcher.join();
    listener.join();
    engine.stop();
    std::fprintf(stderr, "kolos: served %lld requests (%lld tokens); stopped\n",
                 static_cast<long long>(server.metrics.requests.load()),
                 static_cast<long long>(server.metrics.generated_tokens.load()));
    return 0;
  });
}

}  // namespace kolos::cli
#endif  // KOLOS_WITH_HTTPLIB
