// The planner's Schedule as the schedules library's ScheduleKind (a
// candidate without a pipeline counts as 1F1B: one stage holds one
// micro-batch either way).
#pragma once

#include "kolos/planner/candidate.h"
#include "kolos/schedules/plan.h"

namespace kolos::planner {

inline pipeline::ScheduleKind schedule_kind(Schedule s) {
  switch (s) {
    case Schedule::kGPipe:
      return pipeline::ScheduleKind::kGPipe;
    case Schedule::kInterleaved:
      return pipeline::ScheduleKind::kInterleaved;
    case Schedule::kZeroBubble:
      return pipeline::ScheduleKind::kZeroBubble;
    default:
      return pipeline::ScheduleKind::k1F1B;
  }
}

}  // namespace kolos::planner
