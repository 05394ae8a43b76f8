#include "kolos/schedules/plan.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <tuple>

namespace kolos::pipeline {
namespace {

struct Compute {
  Op op;
  int micro;
  int chunk;
};

// The last stage's work has no downstream; F of the first virtual stage has
// no upstream. Wraps compute orders with their transfers (see plan.h).
std::vector<Action> with_transfers(const std::vector<Compute>& order, int rank, int P, int V) {
  const int S = P * V;
  std::vector<Action> out;
  for (const Compute& c : order) {
    const int vs = c.chunk * P + rank;
    switch (c.op) {
      case Op::kForward:
        if (vs > 0) out.push_back({Op::kRecvActivation, c.micro, c.chunk, (vs - 1) % P});
        out.push_back({c.op, c.micro, c.chunk, -1});
        if (vs + 1 < S) out.push_back({Op::kSendActivation, c.micro, c.chunk, (vs + 1) % P});
        break;
      case Op::kBackward:
      case Op::kBackwardInput:
        if (vs + 1 < S) out.push_back({Op::kRecvGrad, c.micro, c.chunk, (vs + 1) % P});
        out.push_back({c.op, c.micro, c.chunk, -1});
        if (vs > 0) out.push_back({Op::kSendGrad, c.micro, c.chunk, (vs - 1) % P});
        break;
      default:
        out.push_back({c.op, c.micro, c.chunk, -1});
    }
  }
  return out;
}

std::vector<Compute> gpipe_order(int M) {
  std::vector<Compute> order;
  for (int m = 0; m < M; ++m) order.push_back({Op::kForward, m, 0});
  for (int m = 0; m < M; ++m) order.push_back({Op::kBackward, m, 0});
  return order;
}

// PipeDream-flush: P-1-r warm-up forwards, then one forward and one
// backward in turn, then the remaining backwards.
std::vector<Compute> one_f_one_b_order(int rank, int P, int M, Op backward) {
  const int warmup = std::min(P - 1 - rank, M);
  std::vector<Compute> order;
  for (int m = 0; m < warmup; ++m) order.push_back({Op::kForward, m, 0});
  for (int i = 0; i + warmup < M; ++i) {
    order.push_back({Op::kForward, warmup + i, 0});
    order.push_back({backward, i, 0});
  }
  for (int m = std::max(0, M - warmup); m < M; ++m) order.push_back({backward, m, 0});
  return order;
}

// Megatron-LM's interleaved 1F1B: micro-batches go through the chunks in
// groups of P; backwards visit the chunks in reverse.
std::vector<Compute> interleaved_order(int rank, int P, int M, int V) {
  const int total = M * V;
  const auto micro_of = [&](int k) { return (k / (P * V)) * P + k % P; };
  const auto chunk_f = [&](int k) { return (k % (P * V)) / P; };
  const auto chunk_b = [&](int k) { return V - 1 - (k % (P * V)) / P; };
  const int warmup = std::min(total, (P - rank - 1) * 2 + (V - 1) * P);
  std::vector<Compute> order;
  for (int k = 0; k < warmup; ++k) order.push_back({Op::kForward, micro_of(k), chunk_f(k)});
  for (int k = 0; k + warmup < total; ++k) {
    const int f = warmup + k;
    order.push_back({Op::kForward, micro_of(f), chunk_f(f)});
    order.push_back({Op::kBackward, micro_of(k), chunk_b(k)});
  }
  for (int k = std::max(0, total - warmup); k < total; ++k) {
    order.push_back({Op::kBackward, micro_of(k), chunk_b(k)});
  }
  return order;
}

// ZB-H1-style: the 1F1B order of forwards and input-gradient passes, with
// each weight-gradient pass W(m) deferred. A rank runs its oldest deferred
// W whenever its next F/BI would have to wait for another rank (the 1F1B
// bubble), or when more than r are deferred, and runs the rest at the end.
// Rank r holds at most P-r activations awaiting BI (as 1F1B) plus r awaiting
// W: at most P, 1F1B's peak (on rank 0), on every rank. Built by list-scheduling all ranks together
// with unit costs, so the decisions are static and identical on every rank.
std::vector<std::vector<Compute>> zero_bubble_orders(int P, int M) {
  const double f = 1.0, bi = 1.0, w = 1.0;
  std::vector<std::vector<Compute>> base(P), out(P);
  for (int r = 0; r < P; ++r) base[r] = one_f_one_b_order(r, P, M, Op::kBackwardInput);
  // Completion times of F(m) and BI(m) per rank.
  std::vector<std::vector<double>> f_done(P, std::vector<double>(M, -1.0));
  std::vector<std::vector<double>> b_done(P, std::vector<double>(M, -1.0));
  std::vector<size_t> next(P, 0);
  std::vector<double> now(P, 0.0);
  std::vector<std::deque<int>> deferred(P);
  const auto ready_at = [&](int r, const Compute& c) {
    if (c.op == Op::kForward) return r == 0 ? 0.0 : f_done[r - 1][c.micro];
    return r == P - 1 ? f_done[r][c.micro] : b_done[r + 1][c.micro];
  };
  for (;;) {
    int pick = -1;
    for (int r = 0; r < P; ++r) {
      const bool left = next[r] < base[r].size() || !deferred[r].empty();
      if (!left) continue;
      if (pick < 0 || now[r] < now[pick]) pick = r;
    }
    if (pick < 0) break;
    const int r = pick;
    auto run_w = [&] {
      out[r].push_back({Op::kBackwardWeight, deferred[r].front(), 0});
      deferred[r].pop_front();
      now[r] += w;
    };
    if (next[r] == base[r].size()) {
      run_w();
      continue;
    }
    const Compute& c = base[r][next[r]];
    const double ready = ready_at(r, c);
    if (ready < 0 || ready > now[r]) {
      if (!deferred[r].empty()) {
        run_w();
        continue;
      }
      if (ready < 0) {
        // Wait for the producer: advance to the earliest time another rank
        // can act, so it runs first.
        double other = std::numeric_limits<double>::infinity();
        for (int q = 0; q < P; ++q) {
          if (q != r && (next[q] < base[q].size() || !deferred[q].empty())) {
            other = std::min(other, now[q]);
          }
        }
        if (!(other < std::numeric_limits<double>::infinity())) {
          throw std::logic_error("zero-bubble plan: no rank can make progress");
        }
        now[r] = std::max(now[r], other) + 1e-9;
        continue;
      }
      now[r] = ready;
    }
    out[r].push_back(c);
    ++next[r];
    if (c.op == Op::kForward) {
      now[r] += f;
      f_done[r][c.micro] = now[r];
    } else {
      now[r] += bi;
      b_done[r][c.micro] = now[r];
      deferred[r].push_back(c.micro);
      if (static_cast<int>(deferred[r].size()) > r) run_w();
    }
  }
  return out;
}

}  // namespace

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  if (name == "zb") return ScheduleKind::kZeroBubble;
  throw std::invalid_argument("unknown pipeline schedule \"" + name +
                              "\"; valid: \"gpipe\", \"1f1b\", \"interleaved\", \"zb\"");
}

const char* to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZeroBubble:
      return "zb";
  }
  return "?";
}

const char* to_string(Op op) {
  switch (op) {
    case Op::kForward:
      return "F";
    case Op::kBackward:
      return "B";
    case Op::kBackwardInput:
      return "BI";
    case Op::kBackwardWeight:
      return "W";
    case Op::kSendActivation:
      return "send-act";
    case Op::kRecvActivation:
      return "recv-act";
    case Op::kSendGrad:
      return "send-grad";
    case Op::kRecvGrad:
      return "recv-grad";
  }
  return "?";
}

std::string describe(const Action& a) {
  std::string s = std::string(to_string(a.op)) + "(" + std::to_string(a.micro) + ",c" +
                  std::to_string(a.chunk) + ")";
  if (a.op == Op::kSendActivation || a.op == Op::kSendGrad) s += "->" + std::to_string(a.peer);
  if (a.op == Op::kRecvActivation || a.op == Op::kRecvGrad) s += "<-" + std::to_string(a.peer);
  return s;
}

int in_flight_bound(ScheduleKind kind, int stages, int micro, int chunks, int rank) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return micro;
    case ScheduleKind::k1F1B:
      return std::min(micro, stages - rank);
    case ScheduleKind::kInterleaved:
      return std::min(micro * chunks, (stages - rank - 1) * 2 + (chunks - 1) * stages + 1);
    case ScheduleKind::kZeroBubble:
      // 1F1B's P-r awaiting BI plus at most r whose W is deferred.
      return std::min(micro, stages);
  }
  return micro;
}

double stage_activations_in_flight(ScheduleKind kind, int stages, int micro, int chunks,
                                   int rank) {
  if (stages <= 1) return 1;  // no pipeline: one micro-batch's forward and backward at a time
  const int v = kind == ScheduleKind::kInterleaved ? std::max(chunks, 1) : 1;
  return static_cast<double>(in_flight_bound(kind, stages, micro, v, rank)) / v;
}

int Plan::in_flight_bound(int rank) const {
  return pipeline::in_flight_bound(kind, stages, micro, chunks, rank);
}

double Plan::theoretical_bubble(double f, double bi, double w) const {
  const double P = stages, M = micro, V = chunks;
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B:
      return (P - 1) / (M + P - 1);
    case ScheduleKind::kInterleaved:
      return (P - 1) / (V * M + P - 1);
    case ScheduleKind::kZeroBubble: {
      const double bubble = (P - 1) * std::max(0.0, f + bi - w);
      return bubble / (M * (f + bi + w) + bubble);
    }
  }
  return 0.0;
}

std::string plan_problem(ScheduleKind kind, int P, int M, int V) {
  const std::string name = std::string("schedule \"") + to_string(kind) + "\"";
  if (P < 1) return "parallel.pipeline.size = " + std::to_string(P) + " must be >= 1";
  if (M < 1) return "the number of micro-batches (" + std::to_string(M) + ") must be >= 1";
  if (V < 1) return "parallel.pipeline.chunks = " + std::to_string(V) + " must be >= 1";
  if (kind != ScheduleKind::kInterleaved && V != 1) {
    return "parallel.pipeline.chunks = " + std::to_string(V) + " only applies to schedule " +
           "\"interleaved\", but the schedule is " + name.substr(9) + "; set chunks = 1 or " +
           "schedule = \"interleaved\"";
  }
  if (kind != ScheduleKind::kGPipe && M < P) {
    return name + " needs at least as many micro-batches as pipeline stages, but there are " +
           std::to_string(M) + " micro-batches for " + std::to_string(P) +
           " stages; use M >= " + std::to_string(P) +
           " (raise train.global_batch or lower train.micro_batch) or schedule = \"gpipe\"";
  }
  if (kind == ScheduleKind::kInterleaved && M % P != 0) {
    const int below = M / P * P;
    return name + " needs the number of micro-batches to be a multiple of the pipeline size, " +
           "but M = " + std::to_string(M) + " and P = " + std::to_string(P) +
           "; use M = " + (below > 0 ? std::to_string(below) + " or " : "") +
           std::to_string(below + P);
  }
  return "";
}

Plan make_plan(ScheduleKind kind, int P, int M, int V) {
  const std::string problem = plan_problem(kind, P, M, V);
  if (!problem.empty()) throw std::invalid_argument(problem);
  Plan plan;
  plan.kind = kind;
  plan.stages = P;
  plan.micro = M;
  plan.chunks = V;
  std::vector<std::vector<Compute>> orders(P);
  if (kind == ScheduleKind::kZeroBubble) {
    orders = zero_bubble_orders(P, M);
  } else {
    for (int r = 0; r < P; ++r) {
      switch (kind) {
        case ScheduleKind::kGPipe:
          orders[r] = gpipe_order(M);
          break;
        case ScheduleKind::k1F1B:
          orders[r] = one_f_one_b_order(r, P, M, Op::kBackward);
          break;
        case ScheduleKind::kInterleaved:
          orders[r] = interleaved_order(r, P, M, V);
          break;
        default:
          break;
      }
    }
  }
  for (int r = 0; r < P; ++r) plan.ranks.push_back(with_transfers(orders[r], r, P, V));
  return plan;
}

double Simulation::mean_idle() const {
  if (idle_fraction.empty()) return 0.0;
  return std::accumulate(idle_fraction.begin(), idle_fraction.end(), 0.0) /
         static_cast<double>(idle_fraction.size());
}

Simulation simulate(const Plan& plan, const Costs& costs) {
  const int P = plan.stages, S = plan.virtual_stages();
  Simulation sim;
  sim.busy.assign(P, 0.0);
  sim.max_in_flight.assign(P, 0);
  // A message: (is_grad, micro, the receiver's virtual stage) -> (time, sender).
  std::map<std::tuple<int, int, int>, std::pair<double, int>> sent;
  std::set<std::tuple<int, int, int>> received;
  std::vector<size_t> pc(P, 0);
  std::vector<double> now(P, 0.0);
  std::vector<int> in_flight(P, 0);
  // Per rank: state of (micro, chunk): 0 none, 1 forward done, 2 input grad done, 3 all done.
  std::vector<std::map<std::pair<int, int>, int>> state(P);
  const bool split = plan.kind == ScheduleKind::kZeroBubble;
  const auto fail = [&](const std::string& why) {
    sim.error = why;
    return sim;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      while (pc[r] < plan.ranks[r].size()) {
        const Action& a = plan.ranks[r][pc[r]];
        const int vs = plan.virtual_stage(r, a.chunk);
        const std::string where =
            "rank " + std::to_string(r) + " action " + std::to_string(pc[r]) + " " + describe(a);
        if (a.chunk < 0 || a.chunk >= plan.chunks || a.micro < 0 || a.micro >= plan.micro) {
          return fail(where + ": micro-batch or chunk out of range");
        }
        int& st = state[r][{a.micro, a.chunk}];
        switch (a.op) {
          case Op::kForward:
            if (st != 0) return fail(where + ": forward runs twice");
            if (vs > 0 && !received.count({0, a.micro, vs})) {
              return fail(where + ": forward before its activation was received");
            }
            st = 1;
            now[r] += costs.forward;
            sim.busy[r] += costs.forward;
            sim.max_in_flight[r] = std::max(sim.max_in_flight[r], ++in_flight[r]);
            break;
          case Op::kBackward:
          case Op::kBackwardInput:
            if (st != 1) return fail(where + ": backward without a preceding forward");
            if ((a.op == Op::kBackwardInput) != split) {
              return fail(where + ": backward kind does not fit the schedule");
            }
            if (vs + 1 < S && !received.count({1, a.micro, vs})) {
              return fail(where + ": backward before its gradient was received");
            }
            st = a.op == Op::kBackward ? 3 : 2;
            {
              const double c = a.op == Op::kBackward ? costs.backward : costs.backward_input;
              now[r] += c;
              sim.busy[r] += c;
            }
            if (a.op == Op::kBackward) --in_flight[r];
            break;
          case Op::kBackwardWeight:
            if (st != 2) return fail(where + ": weight gradient before the input gradient");
            st = 3;
            now[r] += costs.backward_weight;
            sim.busy[r] += costs.backward_weight;
            --in_flight[r];
            break;
          case Op::kSendActivation:
          case Op::kSendGrad: {
            const bool grad = a.op == Op::kSendGrad;
            if (st != (grad ? (split ? 2 : 3) : 1) && !(grad && st == 3)) {
              return fail(where + ": sends data it has not computed");
            }
            const int to = grad ? vs - 1 : vs + 1;
            if (to < 0 || to >= S || a.peer != to % P) {
              return fail(where + ": sends to rank " + std::to_string(a.peer) +
                          " but the neighbouring virtual stage lives on rank " +
                          std::to_string(((to % P) + P) % P));
            }
            auto key = std::make_tuple(grad ? 1 : 0, a.micro, to);
            if (sent.count(key)) return fail(where + ": the same data is sent twice");
            sent[key] = {now[r], r};
            break;
          }
          case Op::kRecvActivation:
          case Op::kRecvGrad: {
            const bool grad = a.op == Op::kRecvGrad;
            auto key = std::make_tuple(grad ? 1 : 0, a.micro, vs);
            auto it = sent.find(key);
            if (it == sent.end()) goto blocked;
            if (it->second.second != a.peer) {
              return fail(where + ": receives from rank " + std::to_string(a.peer) + " but rank " +
                          std::to_string(it->second.second) + " sent it");
            }
            if (!received.insert(key).second) return fail(where + ": received twice");
            now[r] = std::max(now[r], it->second.first);
            break;
          }
        }
        ++pc[r];
        progress = true;
      }
    blocked:;
    }
  }
  for (int r = 0; r < P; ++r) {
    if (pc[r] < plan.ranks[r].size()) {
      std::string waits;
      for (int q = 0; q < P; ++q) {
        if (pc[q] < plan.ranks[q].size()) {
          waits += " rank " + std::to_string(q) + " at " + describe(plan.ranks[q][pc[q]]) + ";";
        }
      }
      return fail("deadlock:" + waits);
    }
  }
  if (received.size() != sent.size()) return fail("a send has no matching receive");
  for (int r = 0; r < P; ++r) {
    for (int c = 0; c < plan.chunks; ++c) {
      for (int m = 0; m < plan.micro; ++m) {
        auto it = state[r].find({m, c});
        if (it == state[r].end() || it->second != 3) {
          return fail("rank " + std::to_string(r) + ": micro-batch " + std::to_string(m) +
                      " of chunk " + std::to_string(c) + " is not fully processed");
        }
      }
    }
  }
  sim.makespan = *std::max_element(now.begin(), now.end());
  for (int r = 0; r < P; ++r) {
    sim.idle_fraction.push_back(sim.makespan > 0 ? 1.0 - sim.busy[r] / sim.makespan : 0.0);
  }
  sim.completed = true;
  return sim;
}

}  // namespace kolos::pipeline
