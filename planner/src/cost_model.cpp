// Step time and traffic of one Candidate (docs/planner.md, "The cost model").
#include "kolos/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kolos/planner/tune.h"

namespace kolos::planner {
namespace {

// kolos's zero-bubble split (docs/pipeline.md): BI computes the input
// gradient, about half a backward; W walks the retained graph again and
// costs about a whole backward, since LibTorch has no per-operator split.
constexpr double kZbInput = 0.5;
constexpr double kZbWeight = 1.0;
// AdamW moves per parameter: the parameter (read, write), its gradient
// (read), m and v (fp32, read and write) and, below fp32, the master (fp32,
// read and write).
double optimizer_bytes_per_param(double e) { return 3 * e + 16 + (e < 4 ? 8 : 0); }
// The host tier's AdamW (the memory role's offloaded states): assumed bytes/s
// of host memory one rank's optimizer streams through.
constexpr double kHostOptimizerBytes = 20e9;
// Kernels one block's forward launches (norms, projections, the attention
// core's steps, activation, residual adds), an assumed count; backward
// launches about twice as many. Each costs the calibration's op_seconds.
constexpr double kOpsPerBlock = 20;
// Products per block: q, k, v, o and the MLP's two.
constexpr double kProductsPerBlock = 6;

struct Comm {
  double fwd = 0, bwd = 0;  // seconds on the critical path
  double bytes = 0;         // sent by one rank, forward and backward
  double fwd_bytes = 0;     // of which in the forward pass
};

double call_time(const Machine& mach, const CollectiveCall& c) {
  return c.count * collective_time(mach, c.op, c.bytes, c.n, c.stride, 0, Sync{c.sync, c.span});
}

// The calls of `site` timed, by pass. A call that hides behind the
// attention core it feeds (a ring's hop) costs what exceeds
// `attention_fwd` (backward: twice it); kPass calls are left to the caller,
// in `*pass_fwd` and `*pass_bwd`. The copies around a call (its `copy`
// bytes) run on the computing thread: on the critical path whatever the
// call hides behind.
Comm price(const Machine& mach, const std::vector<CollectiveCall>& calls, CallSite site,
           double attention_fwd = 0, double* pass_fwd = nullptr, double* pass_bwd = nullptr) {
  Comm out;
  double behind_f = 0, behind_b = 0;
  for (const CollectiveCall& c : calls) {
    if (c.site != site) continue;
    const double t = call_time(mach, c);
    if (c.copy > 0) {
      (c.backward ? out.bwd : out.fwd) += c.count * c.copy * c.bytes / mach.rates.elementwise_bytes;
    }
    out.bytes += c.sent();
    if (!c.backward) out.fwd_bytes += c.sent();
    if (c.hides == Hides::kAttention) {
      (c.backward ? behind_b : behind_f) += t;
    } else if (c.hides == Hides::kPass && pass_fwd != nullptr) {
      *(c.backward ? pass_bwd : pass_fwd) += t;
    } else {
      (c.backward ? out.bwd : out.fwd) += t;
    }
  }
  out.fwd += std::max(0.0, behind_f - attention_fwd);
  out.bwd += std::max(0.0, behind_b - 2 * attention_fwd);
  return out;
}

// One block's forward and backward arithmetic for one micro-batch on one
// rank of candidate c (its tensor and sequence split), by the rates.
void block_times(const Workload& w, const Machine& mach, const Candidate& c, const MemoryQuery& q,
                 double* fwd, double* bwd) {
  const ModelShape& m = w.model;
  const MachineRates& R = mach.rates;
  const double e = w.element_bytes();
  const double tp = static_cast<double>(c.tp), sp = static_cast<double>(c.sp);
  const double b = static_cast<double>(c.micro_batch), s = static_cast<double>(m.seq_len);
  const double h = static_cast<double>(m.hidden);
  const double split = tp * sp;
  const BlockFlops fl = block_forward_flops(m, b);
  const double gemm_f = fl.gemm / split / R.gemm_rate(fl.gemm / split / kProductsPerBlock) +
                        kOpsPerBlock * R.op_seconds;
  const double att_f = fl.attention / split / R.attention_flops;
  const double bsh = b * s * h;
  const double norms_bytes = e * 10 * bsh;
  const double softmax_bytes = e * 4 * b * static_cast<double>(m.heads) * s * s;
  const double wide_bytes = e * 2 * b * s * static_cast<double>(m.ffn());
  // The norms and the residual stream split as the tensors at the block's
  // boundary do.
  const double norm_split = sp * boundary_split(q);
  const double elem_f =
      (norms_bytes / norm_split + (softmax_bytes + wide_bytes) / split) / R.elementwise_bytes;
  *fwd = gemm_f + att_f + elem_f;
  *bwd = 2 * *fwd;
}

}  // namespace

double block_seconds(const ModelShape& m, const MachineRates& rates, double b, double e) {
  Workload w;
  w.model = m;
  w.global_batch = 1;
  w.precision = e >= 4 ? "fp32" : "bf16";
  Cluster cluster;
  cluster.devices_per_node = cluster.nodes = cluster.nvlink_domain = 1;
  cluster.intra_bandwidth = cluster.inter_bandwidth = cluster.host_bandwidth = 1;
  MachineRates r = rates;
  r.block_factor = 1;
  r.block_fixed = 0;
  r.cores = 0;
  Candidate c;
  c.micro_batch = static_cast<int64_t>(b);
  double f = 0, bw = 0;
  block_times(w, Machine{cluster, r}, c, memory_query(w, c), &f, &bw);
  return f + bw;
}

Prediction predict(const Workload& w, const Machine& mach, const Candidate& c,
                   bool simulate_pipeline) {
  const ModelShape& m = w.model;
  const MachineRates& R = mach.rates;
  const double e = w.element_bytes();
  const double tp = static_cast<double>(c.tp), sp = static_cast<double>(c.sp);
  const double b = static_cast<double>(c.micro_batch), s = static_cast<double>(m.seq_len);
  const double h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab);
  const double split = tp * sp;
  const double tokens = s / sp;  // positions per rank outside attention
  // The run as its plugins see it: they say what they send and hold.
  const MemoryQuery q = memory_query(w, c, mach.cluster.runtime_bytes);

  // One block, one micro-batch: arithmetic (block_times), scaled by the
  // calibration's measured block factor.
  double block_f = 0, block_b = 0;
  block_times(w, mach, c, q, &block_f, &block_b);
  // The fixed part: a third forward, two thirds backward, as the arithmetic.
  block_f = block_f * R.block_factor + R.block_fixed / 3;
  block_b = block_b * R.block_factor + 2 * R.block_fixed / 3;
  const BlockFlops fl = block_forward_flops(m, b);
  const double att_f = R.block_factor * fl.attention / split / R.attention_flops;
  const double bsh = b * s * h;
  const double softmax_bytes = e * 4 * b * static_cast<double>(m.heads) * s * s;
  // Fewer cores than ranks on a node: every rank computes at the shared
  // rate the calibration measured, and no communication hides behind
  // compute (the cores that would run it are busy).
  const double node_ranks =
      static_cast<double>(std::min<int64_t>(c.ranks(), mach.cluster.devices_per_node));
  const bool shared = R.cores > 0 && R.cores < node_ranks;
  const double overlap = shared ? 0.0 : kReductionOverlap;

  // One block, one micro-batch: the layers' and the sequence plugin's
  // traffic (a ring's hops hide behind the attention they feed).
  bool tp_priced = true, sp_priced = true, grad_priced = true;
  const std::vector<CollectiveCall> tp_calls = plugin_traffic(q.layers, q, &tp_priced);
  const std::vector<CollectiveCall> sp_calls = plugin_traffic(q.sequence, q, &sp_priced);
  const Comm tpc = price(mach, tp_calls, CallSite::kBlock);
  const Comm spc = price(mach, sp_calls, CallSite::kBlock, shared ? 0.0 : att_f);
  if (c.recompute == Recompute::kFull) {
    block_b += block_f;
  } else if (c.recompute == Recompute::kSelective) {
    block_b += att_f + R.block_factor * softmax_bytes / split / R.elementwise_bytes;
  }
  double comm_f = tpc.fwd + spc.fwd, comm_b = tpc.bwd + spc.bwd;
  double block_bytes_tp = tpc.bytes, block_bytes_sp = spc.bytes;
  if (c.recompute == Recompute::kFull) {
    comm_b += tpc.fwd + spc.fwd;  // the recomputed forward's collectives
    block_bytes_tp += tpc.fwd_bytes;
    block_bytes_sp += spc.fwd_bytes;
  }
  // The layers' calls at the embedding (forward, the first stage) and the
  // head (the last).
  const Comm embedding_c = price(mach, tp_calls, CallSite::kEmbedding);
  const Comm head_c = price(mach, tp_calls, CallSite::kHead);

  // Virtual stages: blocks, the embedding on the first, the logits on the last.
  const int64_t S = c.pp * c.chunks;
  const double nb = static_cast<double>(m.layers) / static_cast<double>(S);
  const double logit = logit_forward_flops(m, b) / split;
  const double head_f = R.block_factor * (logit / R.gemm_rate(logit) +
                                          (e * 3 + 12) * b * tokens * V / tp / R.elementwise_bytes);
  const double embed_f = 3 * e * b * tokens * h / R.elementwise_bytes;
  // The gradients plugin's calls per byte of parameters (their bytes scale
  // with the stage's).
  const std::vector<CollectiveCall> grad_unit = gradient_traffic(q, 1.0, &grad_priced);
  std::vector<StageTimes> stages(S);
  std::vector<double> arith_f(S), arith_b(S), params(S);
  double grad_bytes_micro = 0;  // the gradients plugin's, per micro-batch, the first rank's stages
  for (int64_t vs = 0; vs < S; ++vs) {
    double af = nb * block_f, ab = nb * block_b, cf = nb * comm_f, cb = nb * comm_b;
    double p = nb * m.block_params() / tp;
    if (vs == 0) {
      af += embed_f;
      p += m.embedding_params() / tp;
      cf += embedding_c.fwd, cb += embedding_c.bwd;
    }
    if (vs == S - 1) {
      af += head_f;
      ab += 2 * head_f;
      p += m.head_params() / tp + (S > 1 ? V * h / tp : 0);
      cf += head_c.fwd, cb += head_c.bwd;
    }
    // The gradients plugin's calls per micro-batch over the stage's
    // parameters (ZeRO-2's reduce-scatter, ZeRO-3's gathers): each hides
    // behind its pass up to kReductionOverlap.
    double gf = 0, gb = 0;
    std::vector<CollectiveCall> stage_calls = grad_unit;
    for (CollectiveCall& call : stage_calls) call.bytes *= e * p;
    const Comm g = price(mach, stage_calls, CallSite::kMicroBatch, 0, &gf, &gb);
    if (vs % c.pp == 0) grad_bytes_micro += g.bytes;
    cf += g.fwd + std::max(0.0, gf - overlap * (af + cf));
    cb += g.bwd + std::max(0.0, gb - overlap * (ab + cb));
    arith_f[vs] = af;
    arith_b[vs] = ab;
    params[vs] = p;
    stages[vs].forward = af + cf;
    stages[vs].backward = ab + cb;
    stages[vs].backward_input = kZbInput * stages[vs].backward;
    stages[vs].backward_weight = kZbWeight * stages[vs].backward;
  }
  if (c.schedule == Schedule::kZeroBubble) {
    for (auto& st : stages) st.backward = st.backward_input + st.backward_weight;
  }

  // Pipeline transfers: one activation per micro-batch and boundary each way.
  const double X_pp = e * b * tokens * h / boundary_split(q);
  const int64_t pp_stride = c.dp * c.sp * c.tp;
  const double t_pp =
      c.pp > 1 ? collective_time(mach, Collective::kSendRecv, X_pp, 2, pp_stride) : 0;
  const double M = static_cast<double>(c.microbatches);

  // Per pipeline rank: busy time and its arithmetic.
  double busy_max = 0, arith_of_busiest = 0, params_rank0 = 0, backward_rank0 = 0;
  std::vector<double> rank_busy(c.pp, 0), rank_arith(c.pp, 0);
  for (int64_t vs = 0; vs < S; ++vs) {
    const int64_t r = vs % c.pp;
    rank_busy[r] += M * (stages[vs].forward + stages[vs].backward);
    rank_arith[r] +=
        M * (arith_f[vs] +
             arith_b[vs] * (c.schedule == Schedule::kZeroBubble ? kZbInput + kZbWeight : 1.0));
    if (r == 0) {
      params_rank0 += params[vs];
      backward_rank0 += stages[vs].backward;
    }
  }
  for (int64_t r = 0; r < c.pp; ++r) {
    if (rank_busy[r] > busy_max) busy_max = rank_busy[r], arith_of_busiest = rank_arith[r];
  }
  double makespan = busy_max;
  if (c.pp > 1) {
    // The schedule's makespan for stage times `st` whose busiest rank is
    // busy `busy` seconds.
    auto pipeline = [&](const std::vector<StageTimes>& st, double busy) {
      if (simulate_pipeline) {
        double busiest = 0;
        return simulate_schedule(c.schedule, c.pp, c.microbatches, c.chunks, st, t_pp, &busiest);
      }
      const double f = busy / M / 3, bb = 2 * f;
      const double frac = bubble_fraction(c.schedule, c.pp, c.microbatches, c.chunks, f,
                                          kZbInput * bb, kZbWeight * bb);
      return busy / (1 - frac) + 2 * static_cast<double>(c.pp - 1) * t_pp;
    };
    if (!shared) {
      makespan = pipeline(stages, busy_max);
    } else {
      // Shared cores: a rank the schedule leaves idle lends its share, so
      // a stage alone runs up to node_ranks / cores times faster than the
      // shared rate the stage times are in. The schedule is replayed with
      // the computing ranks splitting the cores the pipeline has (the
      // other pipelines of the node run the same schedule beside it).
      const double k = node_ranks / R.cores;
      std::vector<StageTimes> fast = stages;
      for (auto& st : fast) {
        st.forward /= k, st.backward /= k, st.backward_input /= k, st.backward_weight /= k;
      }
      const double slots = R.cores * static_cast<double>(c.pp) / node_ranks;
      makespan = simulate_pipeline ? simulate_schedule_shared(c.schedule, c.pp, c.microbatches,
                                                              c.chunks, fast, t_pp, slots)
                                   : pipeline(stages, busy_max);
    }
  }

  // The gradients plugin's calls after the step's last backward, over the
  // first rank's parameters (it holds the most: the embedding).
  const double Xg = e * params_rank0;
  double hidden = 0, unused = 0;
  std::vector<CollectiveCall> step_calls = grad_unit;
  for (CollectiveCall& call : step_calls) call.bytes *= Xg;
  const Comm step_c = price(mach, step_calls, CallSite::kStep, 0, &unused, &hidden);
  const double dp_exposed =
      step_c.fwd + step_c.bwd + unused + std::max(0.0, hidden - overlap * backward_rank0);
  const double dp_bytes = step_c.bytes + M * grad_bytes_micro;
  const double opt_params = params_rank0 * optimizer_share(q);
  const double optimizer =
      (1 - c.offload) * opt_params * optimizer_bytes_per_param(e) / R.elementwise_bytes;
  const double off_params = c.offload * params_rank0;
  const double offload = off_params * 3 * e / mach.cluster.host_bandwidth +
                         off_params * optimizer_bytes_per_param(e) / kHostOptimizerBytes;

  Prediction p;
  for (const auto& [priced, role, name] :
       {std::tuple{tp_priced, "layers", q.layers}, std::tuple{sp_priced, "sequence", q.sequence},
        std::tuple{grad_priced, "gradients", q.gradients}}) {
    if (!priced) {
      p.unpriced.push_back(std::string(role) + " plugin `" + name +
                           "` says nothing of what it sends: its traffic is not priced");
    }
  }
  // Shared cores can make the makespan shorter than the busiest rank's
  // time at the shared rate: its compute and communication then shrink in
  // proportion, with no bubble.
  const double scale = makespan < busy_max ? makespan / busy_max : 1.0;
  p.compute = scale * arith_of_busiest;
  p.bubble = std::max(0.0, makespan - busy_max);
  p.comm = scale * (busy_max - arith_of_busiest) + dp_exposed;
  p.optimizer = optimizer;
  p.offload = offload;
  p.step = makespan + dp_exposed + optimizer + offload;
  // This host's measured finalists (tune.h): the family's ratio of measured
  // to modelled steps, and the spread that sets the margin of the finalists.
  p.feedback = 1;
  p.uncertainty = std::max(kMinSpread, R.spread);
  if (!R.feedback.empty()) {
    const std::string family = family_of(c);
    p.feedback = feedback_factor(R, family);
    p.uncertainty = uncertainty(R, family);
  }
  if (R.step_factor * p.feedback != 1) {
    for (double* part : {&p.step, &p.compute, &p.comm, &p.bubble, &p.optimizer, &p.offload}) {
      *part *= R.step_factor * p.feedback;
    }
  }
  p.memory = memory_per_rank(q, mach.cluster, &p.memory_parts);
  const double blocks_rank = static_cast<double>(m.layers) / static_cast<double>(c.pp);
  p.bytes_tp = M * blocks_rank * block_bytes_tp + M * embedding_c.bytes;
  if (c.pp == 1) p.bytes_tp += M * head_c.bytes;
  p.bytes_sp = M * blocks_rank * block_bytes_sp;
  p.bytes_dp = dp_bytes;
  p.bytes_pp = c.pp > 1 ? 2 * M * static_cast<double>(c.chunks) * X_pp : 0;
  p.bytes_sent = p.bytes_tp + p.bytes_sp + p.bytes_dp + p.bytes_pp;
  const Cluster& cl = mach.cluster;
  p.crossing_groups = spans_nodes(cl, c.tp, 1) + spans_nodes(cl, c.sp, c.tp) +
                      spans_nodes(cl, c.dp * c.sp, c.tp) + spans_nodes(cl, c.pp, pp_stride);
  p.model_flops_per_gpu = megatron_step_flops(m, static_cast<double>(w.global_batch)) / p.step /
                          static_cast<double>(c.ranks());
  return p;
}

}  // namespace kolos::planner
