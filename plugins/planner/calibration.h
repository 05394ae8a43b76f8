// The autoplan plugin's calibration: this machine's rates (matrix products,
// attention, memory-bound kernels, a GPT block, the cores, collectives per
// group size) measured by every rank of the world at once.
#pragma once

#include "kolos/core/comm/process_group.h"
#include "kolos/core/run_config.h"
#include "kolos/planner/cluster.h"

namespace kolos::autoplan {

// Collective over `world` (every rank calls it): this machine's rates for
// the planner's cost model, with source "calibration".
planner::MachineRates measure(const comm::ProcessGroupPtr& world, const RunConfig& config);

}  // namespace kolos::autoplan
