// schedule_detail.h: what schedule.cpp and schedule_zb_v.cpp share. Not an interface: schedule.h is.
#pragma once
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::schedule_detail {

// A split backward whose W comes right after its B runs as one backward (schedule.cpp says why).
void join_adjacent_backward(std::vector<PipeInstr>& list);

// ZB-V's instruction lists, one per stage, remembered per (p, m, costs, memory) (schedule_zb_v.cpp).
std::vector<std::vector<PipeInstr>> zb_v_schedule(int p, int m, const ScheduleCosts& costs,
                                                  const ScheduleMemory& memory);

}  // namespace mt::schedule_detail
