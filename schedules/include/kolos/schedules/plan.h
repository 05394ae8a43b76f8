// Pipeline schedules as data: per-rank ordered action lists, torch-free.
//
// A plan for P pipeline ranks, M micro-batches and V model chunks per rank
// (V > 1 only for the interleaved schedule) names, for every rank, the
// order in which it runs
//   F(m, c)   forward of micro-batch m through its chunk c,
//   B(m, c)   backward (input and weight gradients together),
//   BI(m, c)  input-gradient half of a backward (zero-bubble only),
//   W(m, c)   weight-gradient half (zero-bubble only),
// and the point-to-point transfers around them. Chunk c of rank r is the
// virtual stage s = c*P + r (Megatron's interleaving): the model's blocks
// are cut into P*V consecutive virtual stages, so s sends activations to
// s+1, which lives on rank (s+1) % P.
//
// Transfers: every compute that consumes data from another rank is preceded
// by its receive (RecvAct before F, RecvGrad before B/BI); every compute
// whose result another rank needs is followed by its send. Sends never
// block (the executor posts them asynchronously); a receive blocks until the
// matching send was posted. simulate() runs all ranks' lists under those
// rules with given compute costs, so tests can prove a plan completes (no
// deadlock), bound the in-flight activations and measure the bubble.
#pragma once

#include <string>
#include <vector>

namespace kolos::pipeline {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved, kZeroBubble };

// "gpipe", "1f1b", "interleaved", "zb"; throws std::invalid_argument otherwise.
ScheduleKind parse_schedule(const std::string& name);
const char* to_string(ScheduleKind kind);

enum class Op {
  kForward,
  kBackward,
  kBackwardInput,
  kBackwardWeight,
  kSendActivation,
  kRecvActivation,
  kSendGrad,
  kRecvGrad,
};
const char* to_string(Op op);
inline bool is_compute(Op op) { return op <= Op::kBackwardWeight; }

struct Action {
  Op op;
  int micro = 0;
  int chunk = 0;
  int peer = -1;  // the other rank of a transfer
  bool operator==(const Action& o) const {
    return op == o.op && micro == o.micro && chunk == o.chunk && peer == o.peer;
  }
};

struct Plan {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int stages = 1;                          // P
  int micro = 1;                           // M
  int chunks = 1;                          // V
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in order

  int virtual_stages() const { return stages * chunks; }
  int virtual_stage(int rank, int chunk) const { return chunk * stages + rank; }
  // Largest number of micro-batches whose forward ran on `rank` and whose
  // activations it still holds (backward, or W for zero-bubble, not done)
  // that the schedule promises.
  int in_flight_bound(int rank) const;
  // Theoretical idle fraction of the schedule with forward cost f, backward
  // cost b (split b = bi + w for zero-bubble), communication free:
  //   gpipe, 1f1b:  (P-1) / (M + P-1)
  //   interleaved:  (P-1) / (V*M + P-1)
  //   zb (ZB-H1):   (P-1)(f+bi-w) / (M(f+bi+w) + (P-1)(f+bi-w))
  double theoretical_bubble(double f, double bi, double w) const;
};

// Largest number of micro-batch chunks whose forward ran on `rank` of a
// `kind` schedule over `stages` ranks, `micro` micro-batches and `chunks`
// chunks per rank, and whose activations it still holds (backward, or W for
// zero-bubble, not done): what Plan::in_flight_bound(rank) promises, which
// the simulation checks, without building the plan.
int in_flight_bound(ScheduleKind kind, int stages, int micro, int chunks, int rank);
// The same in units of the rank's whole stage (a chunk holds 1/chunks of
// it): the micro-batches' worth of activations the rank keeps at once; 1
// without a pipeline (stages <= 1). The one count the memory estimate and
// the planner use.
double stage_activations_in_flight(ScheduleKind kind, int stages, int micro, int chunks,
                                   int rank);

// Checks P, M, V against what the schedule supports; "" when fine, else a
// message naming the numbers and what would be valid.
std::string plan_problem(ScheduleKind kind, int stages, int micro, int chunks);
// Throws std::invalid_argument with plan_problem()'s message.
Plan make_plan(ScheduleKind kind, int stages, int micro, int chunks = 1);

struct Costs {
  double forward = 1.0;
  double backward = 2.0;         // B
  double backward_input = 1.0;   // BI
  double backward_weight = 1.0;  // W
};

struct Simulation {
  bool completed = false;
  std::string error;                  // why not (deadlock: who waits for what)
  double makespan = 0.0;              // time when the last rank finished
  std::vector<double> busy;           // per rank
  std::vector<int> max_in_flight;     // per rank
  std::vector<double> idle_fraction;  // per rank: 1 - busy / makespan
  double mean_idle() const;
};

// Runs every rank's list: compute takes its cost, a send makes its data
// available at the sender's current time, a receive waits for it. Also
// checks that every transfer has a matching partner (same op pair, micro,
// chunk of the receiver's consumer) and that every F precedes its B.
Simulation simulate(const Plan& plan, const Costs& costs = {});

std::string describe(const Action& action);  // "F(3,c1)", "send-act(3,c1)->2"

}  // namespace kolos::pipeline
