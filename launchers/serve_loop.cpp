// `kolos serve`'s engine loop. Handler threads queue a Job in the inbox and
// wait until the loop admits or refuses it; the loop, on the main thread
// (the only one that touches the scheduler and the engine), admits queued
// requests, cancels those whose client went away, runs a step (or, between
// requests, an idle step every half second for the other ranks), and
// delivers each sampled token to its request, cut at a stop string.
#include <algorithm>
#include <chrono>
#include <string>

#include "kolos/core/error.h"
#include "serve_server.h"

namespace kolos::cli::serve {

std::atomic<bool> g_stop{false};

void Server::submit(const JobPtr& job) {
  {
    std::lock_guard<std::mutex> lock(inbox_mutex);
    if (g_stop.load()) throw ApiError{503, "the server is stopping", "", "server_error"};
    if (queued.load() + scheduled.load() >= max_queue) {
      throw ApiError{429, "too many requests queued (" + std::to_string(max_queue) + ")", "",
                     "rate_limit_error"};
    }
    ++queued;
    inbox.push_back(job);
  }
  inbox_changed.notify_one();
  std::unique_lock<std::mutex> lock(job->mutex);
  job->changed.wait(lock, [&] { return job->admitted; });
  if (job->rejected.status != 0) throw job->rejected;
}

void Server::loop() {
  inference::Scheduler& scheduler = engine.scheduler();
  std::map<int64_t, JobPtr> live;
  metrics.blocks_total = scheduler.allocator().num_blocks();
  auto last_step = std::chrono::steady_clock::now();
  while (true) {
    std::deque<JobPtr> arrived;
    {
      std::unique_lock<std::mutex> lock(inbox_mutex);
      if (inbox.empty() && !scheduler.has_work()) {
        if (g_stop.load()) break;
        inbox_changed.wait_for(lock, std::chrono::milliseconds(100));
      }
      arrived.swap(inbox);
    }
    for (const JobPtr& job : arrived) {
      int64_t id = -1;
      ApiError refused;
      refused.status = 0;
      try {
        id = scheduler.add_request(inference::Request{job->prompt, job->sampling});
      } catch (const Error& e) {
        const std::string what = e.what();
        refused = ApiError{400, what, what.substr(0, what.find(':'))};
      }
      scheduled = scheduler.num_waiting();  // before it leaves the inbox's count
      --queued;
      {
        std::lock_guard<std::mutex> lock(job->mutex);
        job->admitted = true;
        job->rejected = refused;
      }
      job->changed.notify_all();
      if (refused.status == 0) {
        live[id] = job;
        ++metrics.requests;
        job->arrived = std::chrono::steady_clock::now();
        metrics.prompt_tokens += static_cast<int64_t>(job->prompt.size());
      } else {
        ++metrics.rejected;
      }
    }
    // Clients that went away.
    for (auto it = live.begin(); it != live.end();) {
      if (it->second->cancel.load()) {
        scheduler.cancel(it->first);
        finish(*it->second, "cancelled");
        scheduler.forget(it->first);
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    if (scheduler.has_work()) {
      for (const inference::TokenEvent& e : engine.step()) deliver(scheduler, live, e);
      last_step = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - last_step > std::chrono::milliseconds(500)) {
      engine.idle();
      last_step = std::chrono::steady_clock::now();
    }
    metrics.running = scheduler.num_running();
    scheduled = scheduler.num_waiting();
    metrics.waiting = scheduler.num_waiting() + queued.load();
    metrics.blocks_used = scheduler.allocator().num_used();
    metrics.preemptions = scheduler.preemptions();
  }
}

void Server::finish(Job& job, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(job.mutex);
    job.done = true;
    job.finish_reason = reason;
  }
  job.changed.notify_all();
}

void Server::deliver(inference::Scheduler& scheduler, std::map<int64_t, JobPtr>& live,
                     const inference::TokenEvent& e) {
  auto it = live.find(e.request);
  if (it == live.end()) return;
  Job& job = *it->second;
  ++metrics.generated_tokens;
  const auto now = std::chrono::steady_clock::now();
  const bool first = scheduler.generated(e.request).size() == 1;
  (first ? metrics.ttft : metrics.inter_token)
      .observe(std::chrono::duration<double>(now - (first ? job.arrived : job.last_token)).count());
  job.last_token = now;
  std::string reason = e.finish_reason;
  bool finished = e.finished;
  {
    std::lock_guard<std::mutex> lock(job.mutex);
    job.tokens = scheduler.generated(e.request);
    job.logprobs = scheduler.logprobs(e.request);
    if (tok) {
      std::vector<tokenizer::TokenId> ids(job.tokens.begin(), job.tokens.end());
      job.text = tok->decode(ids);
      size_t cut = std::string::npos;
      for (const auto& s : job.stop) cut = std::min(cut, job.text.find(s));
      if (cut != std::string::npos) {
        job.text.resize(cut);
        if (!finished) scheduler.cancel(e.request);
        finished = true;
        reason = "stop";
      }
    }
  }
  job.changed.notify_all();
  if (finished) {
    finish(job, reason);
    scheduler.forget(e.request);
    live.erase(it);
  }
}

}  // namespace kolos::cli::serve
