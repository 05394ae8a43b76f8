// Hierarchical all-reduce (see kolos/core/comm/hierarchical.h).
#include "kolos/core/comm/hierarchical.h"

#include <ATen/ATen.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "kolos/core/error.h"

namespace kolos::comm {
namespace {

// A Work completed by the hierarchical group's thread.
class ChainWork final : public Work {
 public:
  explicit ChainWork(std::string what) : what_(std::move(what)) {}

  bool is_completed() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [this] { return done_; })) {
      throw CommError(what_ + ": not complete after " + std::to_string(timeout.count()) +
                      " ms (still running; waiting again may succeed)");
    }
    if (error_) std::rethrow_exception(error_);
  }

  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  std::string what_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class HierarchicalGroup final : public ProcessGroup {
 public:
  HierarchicalGroup(ProcessGroupPtr flat, const std::vector<std::string>& hosts)
      : flat_(std::move(flat)), name_(flat_->name()) {
    const int n = flat_->size();
    KOLOS_CHECK_KIND(kComm, static_cast<int>(hosts.size()) == n, "hierarchical all-reduce on group '",
                     name_, "': ", hosts.size(), " host names for ", n, " ranks");
    // A node's color: its lowest rank; its leader: that rank.
    std::map<std::string, int> first;
    for (int r = 0; r < n; ++r) first.emplace(hosts[r], r);
    const int color = first.at(hosts[flat_->rank()]);
    node_ = flat_->split(color, flat_->rank(), name_ + "/node");
    leaders_ = flat_->split(node_->rank() == 0 ? 0 : -1, flat_->rank(), name_ + "/leaders");
  }

  ~HierarchicalGroup() override {
    try {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
      }
      cv_.notify_all();
      if (thread_.joinable()) thread_.join();
    } catch (...) {
      std::fprintf(stderr, "kolos: error while stopping the hierarchical all-reduce of '%s'\n",
                   name_.c_str());
    }
  }

  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return flat_->backend() + " (hierarchical all_reduce)"; }

  WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    KOLOS_CHECK_KIND(kComm, tensor.defined() && tensor.is_contiguous(),
                     "hierarchical all_reduce on group '", name_, "' (rank ", rank(), " of ",
                     size(), "): the tensor must be defined and contiguous");
    std::ostringstream what;
    what << "hierarchical all_reduce(" << to_string(op) << ") of " << tensor.numel()
         << " elements on group '" << name_ << "' (rank " << rank() << " of " << size() << ")";
    auto work = std::make_shared<ChainWork>(what.str());
    const ReduceOp stage = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    auto run = [this, tensor, op, stage] {
      node_->reduce(tensor, 0, stage)->wait();
      if (leaders_) leaders_->all_reduce(tensor, stage)->wait();
      node_->broadcast(tensor, 0)->wait();
      if (op == ReduceOp::kAvg && size() > 1 && tensor.numel() > 0) {
        if (at::isFloatingType(tensor.scalar_type())) {
          tensor.div_(size());
        } else {
          tensor.div_(size(), "floor");
        }
      }
    };
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(Task{std::move(run), work});
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
    return work;
  }

  WorkPtr reduce(const at::Tensor& tensor, int root, ReduceOp op) override {
    return flat_->reduce(tensor, root, op);
  }
  WorkPtr reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                         ReduceOp op) override {
    return flat_->reduce_scatter(output, inputs, op);
  }
  WorkPtr reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                              ReduceOp op) override {
    return flat_->reduce_scatter_flat(output, input, op);
  }
  WorkPtr all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input) override {
    return flat_->all_gather(outputs, input);
  }
  WorkPtr all_gather_flat(const at::Tensor& output, const at::Tensor& input) override {
    return flat_->all_gather_flat(output, input);
  }
  WorkPtr broadcast(const at::Tensor& tensor, int root) override {
    return flat_->broadcast(tensor, root);
  }
  WorkPtr all_to_all(const at::Tensor& output, const at::Tensor& input,
                     const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits) override {
    return flat_->all_to_all(output, input, out_splits, in_splits);
  }
  WorkPtr send(const at::Tensor& tensor, int dst, int tag) override {
    return flat_->send(tensor, dst, tag);
  }
  WorkPtr recv(const at::Tensor& tensor, int src, int tag) override {
    return flat_->recv(tensor, src, tag);
  }
  WorkPtr barrier() override { return flat_->barrier(); }
  std::shared_ptr<ProcessGroup> split(int64_t color, int64_t key, const std::string& name) override {
    return flat_->split(color, key, name);
  }

  CommStats stats() const override {
    CommStats total = flat_->stats();
    for (const ProcessGroup* g : {node_.get(), leaders_.get()}) {
      if (g == nullptr) continue;
      const CommStats s = g->stats();
      for (size_t i = 0; i < total.bytes.size(); ++i) {
        total.bytes[i] += s.bytes[i];
        total.calls[i] += s.calls[i];
      }
    }
    return total;
  }
  void reset_stats() override {
    flat_->reset_stats();
    node_->reset_stats();
    if (leaders_) leaders_->reset_stats();
  }

 private:
  struct Task {
    std::function<void()> run;
    std::shared_ptr<ChainWork> work;
  };

  // Runs the queued all-reduces in order; after a stop, those still queued
  // (every rank queued them too) before it exits.
  void loop() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        task.run();
      } catch (...) {
        error = std::current_exception();
      }
      task.work->finish(error);
    }
  }

  ProcessGroupPtr flat_;
  std::string name_;
  ProcessGroupPtr node_, leaders_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::thread thread_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One all-reduce of `sample` on `path`; the slowest rank's seconds (a max
// over `flat`, so every rank returns the same figure).
double timed(ProcessGroup& flat, ProcessGroup& path, const at::Tensor& sample) {
  sample.fill_(1);
  flat.barrier()->wait();
  const auto start = std::chrono::steady_clock::now();
  path.all_reduce(sample, ReduceOp::kAvg)->wait();
  at::Tensor s = at::full({1}, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                             start)
                                   .count(),
                          at::kDouble);
  flat.all_reduce(s, ReduceOp::kMax)->wait();
  return s.item<double>();
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

AllReduceMode parse_all_reduce_mode(const std::string& text) {
  if (text == "auto") return AllReduceMode::kAuto;
  if (text == "hierarchical") return AllReduceMode::kHierarchical;
  KOLOS_CHECK_KIND(kConfig, text == "flat", "allreduce: `", text,
                   "` is none of \"auto\", \"flat\", \"hierarchical\"");
  return AllReduceMode::kFlat;
}

const char* to_string(AllReduceMode mode) {
  switch (mode) {
    case AllReduceMode::kAuto:
      return "auto";
    case AllReduceMode::kFlat:
      return "flat";
    case AllReduceMode::kHierarchical:
      return "hierarchical";
  }
  return "unknown";
}

std::vector<std::string> group_hosts(ProcessGroup& group) {
  constexpr int64_t kName = 256;
  std::string mine(kName, '\0');
  gethostname(mine.data(), kName - 1);
  mine.resize(std::strlen(mine.c_str()));
  if (const char* simulated = std::getenv("KOLOS_SIMULATED_HOSTS")) {
    int world_rank = 0, world_size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    std::vector<std::string> names;
    std::stringstream in(simulated);
    for (std::string name; std::getline(in, name, ',');) names.push_back(name);
    if (static_cast<int>(names.size()) != world_size) {
      throw UsageError("KOLOS_SIMULATED_HOSTS names " + std::to_string(names.size()) +
                       " host(s) for " + std::to_string(world_size) +
                       " ranks; give one name per rank, comma-separated");
    }
    mine = names[world_rank].substr(0, kName - 1);
  }
  const int n = group.size();
  at::Tensor own = at::zeros({kName}, at::kByte);
  std::memcpy(own.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::zeros({n * kName}, at::kByte);
  group.all_gather_flat(all, own)->wait();
  std::vector<std::string> hosts;
  const char* data = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) hosts.emplace_back(data + r * kName);
  return hosts;
}

ProcessGroupPtr make_hierarchical_group(ProcessGroupPtr flat,
                                        const std::vector<std::string>& hosts) {
  return std::make_shared<HierarchicalGroup>(std::move(flat), hosts);
}

std::string AllReduceChoice::describe() const {
  std::ostringstream out;
  out << "allreduce: " << path << " over " << nodes << " node" << (nodes == 1 ? "" : "s") << " ("
      << layout << " ranks of group '" << (group ? group->name() : std::string("?")) << "'): ";
  if (mode != AllReduceMode::kAuto) {
    out << "set by [parallel] allreduce";
  } else if (measured) {
    out << std::fixed;
    out.precision(1);
    out << "auto, measured on " << static_cast<double>(bucket_bytes) / (1 << 20)
        << " MiB buckets: flat ";
    out.precision(2);
    out << flat_s * 1e3 << " ms, hierarchical " << hierarchical_s * 1e3 << " ms (median of "
        << rounds << " rounds, slowest rank)";
  } else {
    out << "auto, " << reason;
  }
  return out.str();
}

std::string AllReduceChoice::json() const {
  std::ostringstream out;
  out.precision(6);
  out << "{\"mode\":\"" << to_string(mode) << "\",\"path\":\"" << path << "\",\"nodes\":" << nodes
      << ",\"ranks_per_node\":\"" << json_escape(layout) << "\"";
  if (measured) {
    out << ",\"bucket_bytes\":" << bucket_bytes << ",\"flat_s\":" << flat_s
        << ",\"hierarchical_s\":" << hierarchical_s << ",\"rounds\":" << rounds;
  }
  return out.str() + "}";
}

AllReduceChoice choose_all_reduce(ProcessGroupPtr group, AllReduceMode mode,
                                  const at::Tensor& sample, int rounds) {
  AllReduceChoice c;
  c.mode = mode;
  c.group = group;
  if (mode == AllReduceMode::kFlat && group->size() == 1) return c;
  if (mode == AllReduceMode::kAuto && group->backend() != "mpi") {
    c.reason = "backend " + group->backend() + " is not timed; flat";  // NCCL: its own rings
    return c;
  }
  const std::vector<std::string> hosts = group_hosts(*group);
  std::vector<std::string> order;  // nodes by their lowest rank
  std::map<std::string, int> per_node;
  for (const auto& h : hosts) {
    if (per_node[h]++ == 0) order.push_back(h);
  }
  c.nodes = static_cast<int>(order.size());
  int most = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    c.layout += (i ? "+" : "") + std::to_string(per_node[order[i]]);
    most = std::max(most, per_node[order[i]]);
  }
  if (mode == AllReduceMode::kFlat) {
    c.reason = "set";
    return c;
  }
  if (mode == AllReduceMode::kHierarchical) {
    c.group = make_hierarchical_group(group, hosts);
    c.path = "hierarchical";
    c.reason = "set";
    return c;
  }
  if (c.nodes == 1) {
    c.reason = "one node";
    return c;
  }
  if (most == 1) {
    c.reason = "one rank per node, where hierarchical equals flat; not measured";
    return c;
  }
  ProcessGroupPtr hier = make_hierarchical_group(group, hosts);
  c.measured = true;
  c.rounds = std::max(1, rounds);
  c.bucket_bytes = sample.numel() * static_cast<int64_t>(sample.element_size());
  timed(*group, *group, sample);  // warm-up: connections, buffers
  timed(*group, *hier, sample);
  std::vector<double> flat_s, hier_s;
  for (int r = 0; r < c.rounds; ++r) {
    if (r % 2 == 0) {
      flat_s.push_back(timed(*group, *group, sample));
      hier_s.push_back(timed(*group, *hier, sample));
    } else {
      hier_s.push_back(timed(*group, *hier, sample));
      flat_s.push_back(timed(*group, *group, sample));
    }
  }
  c.flat_s = median(flat_s);
  c.hierarchical_s = median(hier_s);
  // Every rank holds the same maxima; rank 0's pick is the one all use.
  at::Tensor pick = at::full({1}, c.hierarchical_s < c.flat_s ? 1 : 0, at::kInt);
  group->broadcast(pick, 0)->wait();
  if (pick.item<int>() == 1) {
    c.group = hier;
    c.path = "hierarchical";
  }
  c.reason = "measured";
  return c;
}

}  // namespace kolos::comm
