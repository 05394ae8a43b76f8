// `kolos slurm gen`: a ready sbatch script for given nodes, tasks and config.
//
// The script is launchers/slurm/kolos.sbatch (compiled in, see
// launchers/CMakeLists.txt) with two kinds of edits, so that the template
// stays the one place where the job's logic lives:
//   - `#SBATCH --name=value` lines are set, enabled (`##SBATCH` is a disabled
//     line) or added after the last one;
//   - the defaults of the settings block (`VAR=${VAR:-default}`) and the
//     `train_options=()` line are filled in.
// The config is checked here, with the world size the job will have, so a
// typo or a mesh that does not divide the ranks fails before submission.
#include "slurm_command.h"

#include <unistd.h>

#include <boost/program_options.hpp>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kolos/core/error.h"
#include "kolos/core/run_config.h"
#include "launch.h"

namespace kolos::cli {

extern const char* const kSlurmTemplate;  // slurm_template.cpp, generated from kolos.sbatch

namespace {

namespace po = boost::program_options;

constexpr const char* kSynopsis = "gen [CONFIG] [options] [--set key=value ...] [-o FILE]";

struct SlurmJob {
  std::string config;  // absolute; empty: the script takes it as its first argument
  std::vector<std::string> overrides;
  int nodes = 1;
  int tasks_per_node = 0;  // 0: gpus_per_node, or 2 without GPUs
  int gpus_per_node = 0;
  int cpus_per_task = 1;
  std::string time = "01:00:00";
  int signal_seconds = 300;
  std::string job_name = "kolos";
  std::string output = "kolos-%x-%j.out";
  std::string partition;
  std::string account;
  std::string checkpoint_dir;
  std::string requeue = "auto";
  int max_requeues = -1;  // -1: the template's default
  bool overcommit = false;
  std::vector<std::string> extra_sbatch;
  std::string kolos;
};

// Single-quotes a word for the shell when it needs it.
std::string shell_quote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-+=./:,@%") == std::string::npos) {
    return word;
  }
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (getcwd(cwd, sizeof cwd) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

class Script {
 public:
  explicit Script(const std::string& text) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines_.push_back(line);
  }

  // `#SBATCH --name=value` (`#SBATCH --name` for an empty value): replaces an
  // enabled or disabled line of that option, or adds one after the last.
  void set_option(const std::string& name, const std::string& value = "") {
    const std::string line = "#SBATCH --" + name + (value.empty() ? "" : "=" + value);
    size_t last = 0;
    for (size_t i = 0; i < lines_.size(); ++i) {
      if (is_option(lines_[i], "#SBATCH --" + name) || is_option(lines_[i], "##SBATCH --" + name)) {
        lines_[i] = line;
        return;
      }
      if (lines_[i].rfind("#SBATCH", 0) == 0 || lines_[i].rfind("##SBATCH", 0) == 0) last = i;
    }
    lines_.insert(lines_.begin() + static_cast<long>(last) + 1, line);
  }

  // Disables `#SBATCH --name...` (turns it into `##SBATCH`).
  void disable_option(const std::string& name) {
    for (auto& line : lines_) {
      if (is_option(line, "#SBATCH --" + name)) line = "#" + line;
    }
  }

  // `VAR=${VAR:-value}` in the settings block.
  void set_default(const std::string& var, const std::string& value) {
    const std::string head = var + "=${" + var + ":-";
    for (auto& line : lines_) {
      if (line.rfind(head, 0) != 0) continue;
      const size_t close = line.find('}', head.size());
      line = head + shell_quote(value) + line.substr(close);
      return;
    }
    throw Error("kolos slurm gen: the template has no `" + head + "...}` line");
  }

  void replace_line(const std::string& old_line, const std::string& new_line) {
    for (auto& line : lines_) {
      if (line == old_line) {
        line = new_line;
        return;
      }
    }
    throw Error("kolos slurm gen: the template has no line `" + old_line + "`");
  }

  // Inserts lines after the first line (the #! line).
  void insert_after_shebang(const std::vector<std::string>& lines) {
    lines_.insert(lines_.begin() + 1, lines.begin(), lines.end());
  }

  std::string text() const {
    std::string out;
    for (const auto& line : lines_) out += line + "\n";
    return out;
  }

 private:
  // `line` is `head`, alone or followed by `=value`.
  static bool is_option(const std::string& line, const std::string& head) {
    return line.rfind(head, 0) == 0 && (line.size() == head.size() || line[head.size()] == '=');
  }

  std::vector<std::string> lines_;
};

std::string render(const SlurmJob& job, const std::string& command_line) {
  Script script(kSlurmTemplate);
  script.insert_after_shebang({"# Written by: " + command_line});

  const int tasks = job.tasks_per_node;
  script.set_option("job-name", job.job_name);
  script.set_option("nodes", std::to_string(job.nodes));
  script.set_option("ntasks", std::to_string(job.nodes * tasks));
  // Slurm 22.05 refuses --ntasks-per-node together with --overcommit.
  if (job.nodes > 1 && !job.overcommit) {
    script.set_option("ntasks-per-node", std::to_string(tasks));
  }
  script.set_option("cpus-per-task", std::to_string(job.cpus_per_task));
  if (job.gpus_per_node > 0) {
    // One rank per GPU. --gpu-bind=none keeps every GPU of the node visible
    // to every rank (kolos picks node-local rank % GPUs), so NCCL can use
    // peer-to-peer links between the ranks' GPUs.
    script.set_option("gpus-per-task", "1");
    script.set_option("gpu-bind", "none");
  }
  script.set_option("time", job.time);
  script.set_option("signal", "B:USR1@" + std::to_string(job.signal_seconds));
  script.set_option("output", job.output);
  if (!job.partition.empty()) script.set_option("partition", job.partition);
  if (!job.account.empty()) script.set_option("account", job.account);
  if (job.overcommit) script.set_option("overcommit");
  for (const auto& extra : job.extra_sbatch) {
    const std::string option = extra.rfind("--", 0) == 0 ? extra.substr(2) : extra;
    const size_t eq = option.find('=');
    if (eq == std::string::npos) {
      script.set_option(option);
    } else {
      script.set_option(option.substr(0, eq), option.substr(eq + 1));
    }
  }
  if (job.requeue == "never") script.disable_option("requeue");

  script.set_default("KOLOS", job.kolos);
  script.set_default("KOLOS_CONFIG", job.config);
  script.set_default("KOLOS_CHECKPOINT_DIR", job.checkpoint_dir);
  script.set_default("KOLOS_REQUEUE", job.requeue);
  if (job.max_requeues >= 0) {
    script.set_default("KOLOS_MAX_REQUEUES", std::to_string(job.max_requeues));
  }
  if (!job.overrides.empty()) {
    std::string line = "train_options=(";
    for (size_t i = 0; i < job.overrides.size(); ++i) {
      line += (i ? " --set " : "--set ") + shell_quote(job.overrides[i]);
    }
    script.replace_line("train_options=()", line + ")");
  }
  return script.text();
}

void check_config(const SlurmJob& job) {
  if (job.config.empty()) return;
  RunConfig config = load_run_config(job.config, job.overrides);
  resolve_mesh_shape(config, static_cast<int64_t>(job.nodes) * job.tasks_per_node);
}

int gen(const std::vector<std::string>& args) {
  SlurmJob job;
  std::string out_path;
  po::options_description options("options");
  auto add = options.add_options();
  add("config", po::value(&job.config),
      "the run's TOML (checked now, read by the job; omitted: the script takes it as its first "
      "argument)");
  add("set", po::value(&job.overrides)->composing(), "override a key: --set train.steps=100");
  add("nodes,N", po::value(&job.nodes)->default_value(1), "nodes");
  add("tasks-per-node,n", po::value(&job.tasks_per_node),
      "ranks per node (default: --gpus-per-node, or 2 without GPUs)");
  add("gpus-per-node,g", po::value(&job.gpus_per_node)->default_value(0),
      "GPUs per node; one rank per GPU");
  add("cpus-per-task,c", po::value(&job.cpus_per_task)->default_value(1),
      "cores per rank (its BLAS/LibTorch threads)");
  add("time,t", po::value(&job.time)->default_value(job.time), "time limit (Slurm syntax)");
  add("signal-seconds", po::value(&job.signal_seconds)->default_value(job.signal_seconds),
      "SIGUSR1 this many seconds before the time limit: stop, checkpoint, requeue");
  add("job-name,J", po::value(&job.job_name)->default_value(job.job_name), "job name");
  add("output", po::value(&job.output)->default_value(job.output),
      "output file pattern (appended to across requeues)");
  add("partition,p", po::value(&job.partition), "partition");
  add("account,A", po::value(&job.account), "account");
  add("checkpoint-dir", po::value(&job.checkpoint_dir),
      "checkpoint directory on shared storage (sets checkpoint.dir; resume from its `latest`)");
  add("requeue", po::value(&job.requeue)->default_value(job.requeue),
      "after a stop request: auto (when a checkpoint exists), always, never");
  add("max-requeues", po::value(&job.max_requeues), "stop requeueing after this many restarts");
  add("overcommit", po::bool_switch(&job.overcommit), "more ranks than CPUs (tests, laptops)");
  add("sbatch", po::value(&job.extra_sbatch)->composing(),
      "another #SBATCH option, e.g. --sbatch=--mail-type=END (repeatable)");
  add("kolos", po::value(&job.kolos), "the kolos executable on the nodes (default: this one)");
  add("output-file,o", po::value(&out_path), "write the script here (default: standard output)");
  add("help,h", "show this help");
  po::positional_options_description positional;
  positional.add("config", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: kolos slurm " << kSynopsis << "\n\n"
                << "Writes an sbatch script (launchers/slurm/kolos.sbatch filled in) that runs\n"
                << "`srun --mpi=pmix kolos train CONFIG` on every task and requeues the job\n"
                << "after a stop before the time limit. Submit it with `sbatch FILE`.\n\n"
                << options << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(std::string("kolos slurm gen: ") + e.what() +
                     " (see `kolos slurm gen --help`)");
  }
  if (job.nodes < 1) throw UsageError("kolos slurm gen: --nodes must be at least 1");
  if (job.gpus_per_node < 0) throw UsageError("kolos slurm gen: --gpus-per-node must be >= 0");
  if (job.tasks_per_node == 0) job.tasks_per_node = job.gpus_per_node > 0 ? job.gpus_per_node : 2;
  if (job.tasks_per_node < 1) throw UsageError("kolos slurm gen: --tasks-per-node must be >= 1");
  if (job.gpus_per_node > 0 && job.tasks_per_node != job.gpus_per_node) {
    throw UsageError("kolos slurm gen: one rank per GPU: --tasks-per-node " +
                     std::to_string(job.tasks_per_node) + " differs from --gpus-per-node " +
                     std::to_string(job.gpus_per_node));
  }
  if (job.cpus_per_task < 1) throw UsageError("kolos slurm gen: --cpus-per-task must be >= 1");
  if (job.signal_seconds < 1) throw UsageError("kolos slurm gen: --signal-seconds must be >= 1");
  if (job.requeue != "auto" && job.requeue != "always" && job.requeue != "never") {
    throw UsageError("kolos slurm gen: --requeue must be auto, always or never, got `" +
                     job.requeue + "`");
  }
  job.config = absolute(job.config);
  job.checkpoint_dir = absolute(job.checkpoint_dir);
  if (job.kolos.empty()) job.kolos = self_executable();

  check_config(job);

  // The arguments that shape the script, so that it can be written again
  // (tests/launch checks the committed templates that way); not -o FILE.
  std::string command_line = "kolos slurm gen";
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-o" || args[i] == "--output-file") {
      ++i;
      continue;
    }
    if (args[i].rfind("--output-file=", 0) == 0 ||
        (args[i].rfind("-o", 0) == 0 && args[i].size() > 2)) {
      continue;
    }
    command_line += " " + shell_quote(args[i]);
  }
  const std::string script = render(job, command_line);
  if (out_path.empty()) {
    std::cout << script;
    return 0;
  }
  std::ofstream out(out_path);
  out << script;
  out.close();
  if (!out) throw UsageError("kolos slurm gen: cannot write " + out_path);
  std::cerr << "kolos: wrote " << out_path << " (" << job.nodes << " node(s) x "
            << job.tasks_per_node << " rank(s)); submit it with: sbatch " << out_path << "\n";
  return 0;
}

}  // namespace

int slurm_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << "usage: kolos slurm " << kSynopsis << "\n"
              << "see `kolos slurm gen --help`\n";
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "gen") return gen({args.begin() + 1, args.end()});
  std::string hint = closest_match(args[0], {"gen"});
  throw UsageError("kolos slurm: unknown command `" + args[0] + "`" +
                   (hint.empty() ? "" : " (did you mean `" + hint + "`?)") +
                   "; expected `kolos slurm gen ...`");
}

}  // namespace kolos::cli
