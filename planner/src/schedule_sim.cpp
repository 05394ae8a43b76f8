// The pipeline's idle time, from the schedules the pipeline plugin runs
// (libkolos_schedules, kolos/schedules/plan.h: make_plan gives every rank's
// ordered actions).
// plan.h's simulate() takes one cost per kind of pass for all ranks and no
// transfer time; the planner needs per-stage times (the first stage holds
// the embedding, the last the logits) and a delay per message, so it
// replays the same action lists under the same rules (a receive waits for
// its send; sends never block) with those.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "kolos/planner/cost_model.h"
#include "kolos/schedules/plan.h"
#include "schedule_kind.h"

namespace kolos::planner {
namespace {

// make_plan is deterministic in (kind, P, M, V): the search asks for the
// same plans many times.
const pipeline::Plan& cached_plan(Schedule s, int64_t P, int64_t M, int64_t V) {
  static std::map<std::tuple<int, int64_t, int64_t, int64_t>, pipeline::Plan> cache;
  const auto key = std::make_tuple(static_cast<int>(s), P, M, V);
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache
             .emplace(key, pipeline::make_plan(schedule_kind(s), static_cast<int>(P), static_cast<int>(M),
                                               static_cast<int>(V)))
             .first;
  }
  return it->second;
}

}  // namespace

double bubble_fraction(Schedule kind, int64_t P, int64_t M, int64_t V, double f, double bi,
                       double w) {
  if (P <= 1) return 0;
  pipeline::Plan plan;
  plan.kind = schedule_kind(kind);
  plan.stages = static_cast<int>(P);
  plan.micro = static_cast<int>(M);
  plan.chunks = static_cast<int>(V);
  return plan.theoretical_bubble(f, bi, w);
}

double simulate_schedule(Schedule kind, int64_t P, int64_t M, int64_t V,
                         const std::vector<StageTimes>& stage, double transfer, double* busiest) {
  using pipeline::Op;
  const pipeline::Plan& plan = cached_plan(kind, P, M, V);
  const int64_t S = P * V;
  if (static_cast<int64_t>(stage.size()) != S) {
    throw std::invalid_argument("simulate_schedule: one StageTimes per virtual stage is needed");
  }
  // Arrival time of (gradient?, micro-batch, receiving virtual stage); -1: not sent.
  std::vector<double> arrival(2 * M * S, -1.0);
  const auto slot = [&](bool grad, int micro, int64_t vs) {
    return (static_cast<int64_t>(grad) * M + micro) * S + vs;
  };
  std::vector<size_t> pc(P, 0);
  std::vector<double> now(P, 0.0), busy(P, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < P; ++r) {
      const auto& actions = plan.ranks[r];
      for (; pc[r] < actions.size(); ++pc[r]) {
        const pipeline::Action& a = actions[pc[r]];
        const int64_t vs = static_cast<int64_t>(a.chunk) * P + r;
        const StageTimes& t = stage[vs];
        double cost = 0;
        switch (a.op) {
          case Op::kForward:
            cost = t.forward;
            break;
          case Op::kBackward:
            cost = t.backward;
            break;
          case Op::kBackwardInput:
            cost = t.backward_input;
            break;
          case Op::kBackwardWeight:
            cost = t.backward_weight;
            break;
          case Op::kSendActivation:
            arrival[slot(false, a.micro, vs + 1)] = now[r] + transfer;
            break;
          case Op::kSendGrad:
            arrival[slot(true, a.micro, vs - 1)] = now[r] + transfer;
            break;
          case Op::kRecvActivation:
          case Op::kRecvGrad: {
            const double at = arrival[slot(a.op == Op::kRecvGrad, a.micro, vs)];
            if (at < 0) goto blocked;
            now[r] = std::max(now[r], at);
            break;
          }
        }
        now[r] += cost;
        busy[r] += cost;
        progress = true;
      }
    blocked:;
    }
  }
  for (int64_t r = 0; r < P; ++r) {
    if (pc[r] < plan.ranks[r].size()) {
      throw std::logic_error("simulate_schedule: the plan did not complete (rank " +
                             std::to_string(r) + ")");
    }
  }
  if (busiest != nullptr) *busiest = *std::max_element(busy.begin(), busy.end());
  return *std::max_element(now.begin(), now.end());
}

double simulate_schedule_shared(Schedule kind, int64_t P, int64_t M, int64_t V,
                                const std::vector<StageTimes>& stage, double transfer,
                                double slots) {
  using pipeline::Op;
  const pipeline::Plan& plan = cached_plan(kind, P, M, V);
  const int64_t S = P * V;
  if (static_cast<int64_t>(stage.size()) != S) {
    throw std::invalid_argument(
        "simulate_schedule_shared: one StageTimes per virtual stage is needed");
  }
  std::vector<double> arrival(2 * M * S, -1.0);
  const auto slot = [&](bool grad, int micro, int64_t vs) {
    return (static_cast<int64_t>(grad) * M + micro) * S + vs;
  };
  std::vector<size_t> pc(P, 0);
  std::vector<double> remaining(P, 0.0);  // work left of the pass under way (full-core seconds)
  std::vector<double> wait_until(P, -1.0);
  double t = 0;
  for (;;) {
    // Move every rank past what takes no compute, up to its next pass or a
    // receive whose message has not arrived, until no rank moves (a send
    // may unblock a rank looked at before it).
    for (bool moved = true; moved;) {
      moved = false;
      for (int64_t r = 0; r < P; ++r) {
        const auto& actions = plan.ranks[r];
        wait_until[r] = -1;
        while (remaining[r] <= 0 && pc[r] < actions.size()) {
          const pipeline::Action& a = actions[pc[r]];
          const int64_t vs = static_cast<int64_t>(a.chunk) * P + r;
          const StageTimes& st = stage[vs];
          if (a.op == Op::kSendActivation) {
            arrival[slot(false, a.micro, vs + 1)] = t + transfer;
          } else if (a.op == Op::kSendGrad) {
            arrival[slot(true, a.micro, vs - 1)] = t + transfer;
          } else if (a.op == Op::kRecvActivation || a.op == Op::kRecvGrad) {
            const double at = arrival[slot(a.op == Op::kRecvGrad, a.micro, vs)];
            if (at < 0 || at > t) {
              wait_until[r] = at;  // -1: not sent yet
              break;
            }
          } else {
            remaining[r] = a.op == Op::kForward         ? st.forward
                           : a.op == Op::kBackward      ? st.backward
                           : a.op == Op::kBackwardInput ? st.backward_input
                                                        : st.backward_weight;
            if (remaining[r] <= 0) remaining[r] = 1e-15;
            moved = true;
            break;
          }
          ++pc[r];
          moved = true;
        }
      }
    }
    int active = 0;
    for (int64_t r = 0; r < P; ++r) active += remaining[r] > 0;
    double next_arrival = -1;
    for (int64_t r = 0; r < P; ++r) {
      if (wait_until[r] > t && (next_arrival < 0 || wait_until[r] < next_arrival)) {
        next_arrival = wait_until[r];
      }
    }
    if (active == 0) {
      if (next_arrival < 0) break;  // done (or stuck: checked below)
      t = next_arrival;
      continue;
    }
    // Processor sharing: the active ranks split `slots` cores, none faster
    // than one core.
    const double rate = std::min(1.0, slots / static_cast<double>(active));
    double dt = -1;
    for (int64_t r = 0; r < P; ++r) {
      if (remaining[r] > 0 && (dt < 0 || remaining[r] / rate < dt)) dt = remaining[r] / rate;
    }
    if (next_arrival > t) dt = std::min(dt, next_arrival - t);
    t += dt;
    for (int64_t r = 0; r < P; ++r) {
      if (remaining[r] <= 0) continue;
      remaining[r] -= dt * rate;
      if (remaining[r] <= 1e-12) {
        remaining[r] = 0;
        ++pc[r];
      }
    }
  }
  for (int64_t r = 0; r < P; ++r) {
    if (pc[r] < plan.ranks[r].size()) {
      throw std::logic_error("simulate_schedule_shared: the plan did not complete (rank " +
                             std::to_string(r) + ")");
    }
  }
  return t;
}

}  // namespace kolos::planner
