// The communication watchdog and its heartbeats (kolos/core/comm/watchdog.h).
#include "kolos/core/comm/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace kolos::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kCheckEvery(200);
constexpr milliseconds kBeatEvery(1000);
constexpr milliseconds kSilentAfter(3000);  // a rank unheard for longer stopped answering
constexpr int kBeatTag = 1;
constexpr int kVerdictTag = 2;
constexpr int kMaxNamed = 8;          // silent ranks a verdict carries
constexpr size_t kMaxOutstanding = 64;  // unfinished heartbeat sends before skipping some
constexpr int kHostLength = 64;
constexpr milliseconds kDrainFor(10000);  // stop() waits this long for the peers' last messages

std::atomic<int64_t> g_step{-1};
// Run before MPI_Abort when an operation times out (NCCL communicators).
std::mutex g_hooks_mutex;
std::vector<std::function<void()>> g_abort_hooks;
std::atomic<int64_t> g_micro{-1};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string fixed1(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

struct Entry {
  uint64_t token;
  Clock::time_point start;
  std::function<std::string()> describe;
};

// A heartbeat or verdict send in flight, with the buffer MPI reads.
struct Outgoing {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<int> data;
};

class Watchdog {
 public:
  uint64_t begin(std::function<std::string()> describe) {
    if (!running_.load(std::memory_order_acquire)) return 0;
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t token = next_++;
    entries_.push_back(Entry{token, Clock::now(), std::move(describe)});
    return token;
  }

  void end(uint64_t token) {
    if (token == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    // A rank has a handful of operations in flight; the newest ends first.
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
      if (it->token == token) {
        entries_.erase(std::next(it).base());
        break;
      }
    }
  }

  void start(milliseconds timeout, int rank, int size, const std::string& host) {
    if (running_.load()) return;
    timeout_ms_.store(timeout.count());
    rank_ = rank;
    size_ = size;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_name(comm_, const_cast<char*>("kolos-heartbeat"));
    std::vector<char> mine(kHostLength, '\0');
    std::memcpy(mine.data(), host.data(), std::min<size_t>(host.size(), kHostLength - 1));
    std::vector<char> all(static_cast<size_t>(kHostLength) * size, '\0');
    MPI_Allgather(mine.data(), kHostLength, MPI_CHAR, all.data(), kHostLength, MPI_CHAR, comm_);
    hosts_.clear();
    for (int r = 0; r < size; ++r) hosts_.emplace_back(all.data() + r * kHostLength);
    const auto now = Clock::now();
    last_seen_.assign(size, now);
    sent_to_.assign(size, 0);
    received_from_.assign(size, 0);
    last_verdict_ = now;
    last_tick_ = now;
    frozen_at_ = Clock::time_point{};
    verdict_.clear();
    stop_ = false;
    running_.store(true, std::memory_order_release);
    thread_ = std::thread([this] { loop(); });
  }

  void stop() {
    if (!running_.exchange(false)) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      entries_.clear();
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    const bool drained = drain();
    // A send still unfinished (its peer never arrived) is released, not
    // waited for.
    for (Outgoing& out : outgoing_) {
      int done = 0;
      MPI_Test(&out.request, &done, MPI_STATUS_IGNORE);
      if (!done && out.request != MPI_REQUEST_NULL) MPI_Request_free(&out.request);
    }
    outgoing_.clear();
    // An unfinished exchange of counts still uses the communicator.
    if (drained) MPI_Comm_free(&comm_);
  }

  bool running() const { return running_.load(std::memory_order_acquire); }
  milliseconds timeout() const { return milliseconds(timeout_ms_.load()); }
  void set_timeout(milliseconds timeout) { timeout_ms_.store(timeout.count()); }

 private:
  void loop() {
    auto next_beat = Clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, kCheckEvery, [this] { return stop_; });
      if (stop_) break;
      lock.unlock();
      const auto now = Clock::now();
      if (now - last_tick_ > kSilentAfter) {
        // This process itself did not run (SIGSTOP, a starved node): what
        // it knows of the others' heartbeats is stale, not evidence.
        frozen_at_ = now;
        frozen_for_ = now - last_tick_;
        std::fill(last_seen_.begin(), last_seen_.end(), now);
        last_verdict_ = now;
        verdict_.clear();
      }
      last_tick_ = now;
      if (now >= next_beat) {
        beat();
        next_beat = now + kBeatEvery;
      }
      receive();
      lock.lock();
      check(now);  // with the lock: it reads the entries
    }
  }

  // Receives the heartbeats and verdicts still in flight when every rank
  // stops: each rank learns how many messages every peer sent it and takes
  // those it has not received. Left in MPI, they would stay unmatched (UCX
  // warns of each one at MPI_Finalize). Bounded by kDrainFor: a peer that
  // does not stop in time is not waited for. True when the counts' exchange
  // finished.
  bool drain() {
    std::vector<int> expected(size_, 0);
    MPI_Request counts = MPI_REQUEST_NULL;
    if (MPI_Ialltoall(sent_to_.data(), 1, MPI_INT, expected.data(), 1, MPI_INT, comm_, &counts) !=
        MPI_SUCCESS) {
      return true;  // nothing pending on the communicator
    }
    const auto deadline = Clock::now() + kDrainFor;
    bool exchanged = false;
    for (;;) {
      if (!exchanged) {
        int done = 0;
        MPI_Test(&counts, &done, MPI_STATUS_IGNORE);
        exchanged = done != 0;
      }
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &status) == MPI_SUCCESS && flag) {
        int count = 0;
        MPI_Get_count(&status, MPI_INT, &count);
        std::vector<int> data(std::max(count, 1));
        MPI_Recv(data.data(), count, MPI_INT, status.MPI_SOURCE, status.MPI_TAG, comm_,
                 MPI_STATUS_IGNORE);
        ++received_from_[status.MPI_SOURCE];
        continue;
      }
      bool outgoing_done = true;
      for (Outgoing& out : outgoing_) {
        int done = 0;
        MPI_Test(&out.request, &done, MPI_STATUS_IGNORE);
        outgoing_done = outgoing_done && done != 0;
      }
      if (exchanged && outgoing_done &&
          std::equal(expected.begin(), expected.end(), received_from_.begin(),
                     [](int sent, int received) { return received >= sent; })) {
        return true;
      }
      if (Clock::now() >= deadline) return exchanged;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // ---- heartbeats (this thread only) ----------------------------------------

  void send(std::vector<int> data, int to, int tag) {
    outgoing_.erase(std::remove_if(outgoing_.begin(), outgoing_.end(),
                                   [](Outgoing& out) {
                                     int done = 0;
                                     MPI_Test(&out.request, &done, MPI_STATUS_IGNORE);
                                     return done != 0;
                                   }),
                    outgoing_.end());
    if (outgoing_.size() >= kMaxOutstanding) return;  // the peer is not receiving
    outgoing_.emplace_back();
    Outgoing& out = outgoing_.back();
    out.data = std::move(data);
    if (MPI_Isend(out.data.data(), static_cast<int>(out.data.size()), MPI_INT, to, tag, comm_,
                  &out.request) != MPI_SUCCESS) {
      outgoing_.pop_back();
      return;
    }
    ++sent_to_[to];
  }

  void beat() {
    if (rank_ == 0) {
      last_seen_[0] = Clock::now();
    } else {
      send({rank_}, 0, kBeatTag);
    }
  }

  // Ranks other than `self` unheard for longer than kSilentAfter (rank 0).
  std::vector<int> silent_ranks(Clock::time_point now) const {
    std::vector<int> out;
    for (int r = 1; r < size_; ++r) {
      if (now - last_seen_[r] > kSilentAfter) out.push_back(r);
    }
    return out;
  }

  void receive() {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      const int tag = rank_ == 0 ? kBeatTag : kVerdictTag;
      if (MPI_Iprobe(rank_ == 0 ? MPI_ANY_SOURCE : 0, tag, comm_, &flag, &status) != MPI_SUCCESS ||
          !flag) {
        return;
      }
      int count = 0;
      MPI_Get_count(&status, MPI_INT, &count);
      std::vector<int> data(std::max(count, 1));
      MPI_Recv(data.data(), count, MPI_INT, status.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE);
      ++received_from_[status.MPI_SOURCE];
      const auto now = Clock::now();
      if (rank_ == 0) {
        last_seen_[status.MPI_SOURCE] = now;
        // The answer: [n, rank, silence in ms, ...] for up to kMaxNamed ranks.
        std::vector<int> verdict = {0};
        for (int r : silent_ranks(now)) {
          if (verdict[0] == kMaxNamed) break;
          ++verdict[0];
          verdict.push_back(r);
          verdict.push_back(static_cast<int>(
              std::chrono::duration_cast<milliseconds>(now - last_seen_[r]).count()));
        }
        send(std::move(verdict), status.MPI_SOURCE, kVerdictTag);
      } else {
        last_verdict_ = now;
        verdict_.assign(data.begin(), data.begin() + count);
      }
    }
  }

  std::string rank_name(int r) const {
    return "rank " + std::to_string(r) + " (" + (r < static_cast<int>(hosts_.size()) ? hosts_[r] : "?") +
           ")";
  }

  // Who stopped answering, as this rank knows it.
  std::string heartbeat_verdict(Clock::time_point now) const {
    std::vector<std::string> named;
    if (rank_ == 0) {
      for (int r : silent_ranks(now)) {
        named.push_back(rank_name(r) + " stopped answering: no heartbeat for " +
                        fixed1(seconds(now - last_seen_[r])) + " s");
      }
    } else if (now - last_verdict_ > kSilentAfter) {
      named.push_back(rank_name(0) + " stopped answering: no heartbeat answer for " +
                      fixed1(seconds(now - last_verdict_)) + " s");
    } else if (!verdict_.empty()) {
      const double since = seconds(now - last_verdict_);
      for (int i = 0; i < verdict_[0] && 2 + 2 * i < static_cast<int>(verdict_.size()); ++i) {
        const int r = verdict_[1 + 2 * i];
        named.push_back(rank_name(r) + " stopped answering: no heartbeat for " +
                        fixed1(verdict_[2 + 2 * i] / 1000.0 + since) + " s");
      }
    }
    std::string out;
    if (frozen_at_ != Clock::time_point{} && now - frozen_at_ < std::chrono::seconds(10)) {
      out = "this rank itself did not run for " + fixed1(seconds(frozen_for_)) +
            " s (stopped or starved), so heartbeats cannot tell who stopped";
      return out;
    }
    if (named.empty()) {
      return "every rank still answers heartbeats (one is busy or waiting elsewhere, not stopped)";
    }
    for (const auto& n : named) out += (out.empty() ? "" : "; ") + n;
    return out;
  }

  // ---- deadlines --------------------------------------------------------------

  void check(Clock::time_point now) {
    if (entries_.empty()) return;
    const Entry& oldest = entries_.front();  // tokens grow with time
    const auto age = now - oldest.start;
    if (age <= timeout()) return;
    std::ostringstream line;
    line << "kolos: communication timeout on " << rank_name(rank_) << ": " << oldest.describe()
         << " has not completed after " << fixed1(seconds(age)) << " s (the deadline is "
         << fixed1(timeout().count() / 1000.0)
         << " s: [runtime] comm_timeout_s or KOLOS_COMM_TIMEOUT_S); ";
    const int64_t step = g_step.load();
    const int64_t micro = g_micro.load();
    if (step < 0) {
      line << "during set-up";
    } else {
      line << "step " << step;
      if (micro >= 0) line << ", micro-batch " << micro;
    }
    line << "; " << heartbeat_verdict(now) << "; ending the job\n";
    const std::string text = line.str();
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
    ::alarm(10);  // should MPI_Abort itself hang, SIGALRM ends this process
    {
      std::lock_guard<std::mutex> lock(g_hooks_mutex);
      for (const auto& hook : g_abort_hooks) hook();
    }
    MPI_Abort(MPI_COMM_WORLD, 1);
    ::_exit(1);
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  // In begin() order, so the oldest first. A vector keeps its capacity: no
  // allocation per operation once a few have run.
  std::vector<Entry> entries_;
  uint64_t next_ = 1;
  bool stop_ = false;
  std::atomic<bool> running_{false};
  std::atomic<int64_t> timeout_ms_{600000};
  std::thread thread_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::string> hosts_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::deque<Outgoing> outgoing_;
  std::vector<Clock::time_point> last_seen_;
  std::vector<int> sent_to_;        // messages sent to each rank
  std::vector<int> received_from_;  // messages received from each rank
  Clock::time_point last_verdict_;
  Clock::time_point last_tick_;            // the loop's previous round
  Clock::time_point frozen_at_;            // when this process last found itself frozen
  Clock::duration frozen_for_{};
  std::vector<int> verdict_;
};

// Never destroyed: operations may end during static destruction.
Watchdog& dog() {
  static Watchdog* watchdog = new Watchdog;
  return *watchdog;
}

}  // namespace

void add_watchdog_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(g_hooks_mutex);
  g_abort_hooks.push_back(std::move(hook));
}

void set_progress_step(int64_t step) { g_step.store(step, std::memory_order_relaxed); }
void set_progress_micro_batch(int64_t micro_batch) {
  g_micro.store(micro_batch, std::memory_order_relaxed);
}

uint64_t watchdog_begin(std::function<std::string()> describe) {
  return dog().begin(std::move(describe));
}
void watchdog_end(uint64_t token) { dog().end(token); }

void start_watchdog(milliseconds timeout, int rank, int size, const std::string& host) {
  dog().start(timeout, rank, size, host);
}
void stop_watchdog() { dog().stop(); }
bool watchdog_running() { return dog().running(); }
void set_watchdog_timeout(milliseconds timeout) { dog().set_timeout(timeout); }
milliseconds watchdog_timeout() { return dog().timeout(); }

}  // namespace kolos::comm
