// pipeline_schedule.h: the pipeline schedule a resolved config trains with (parallel.pipeline_schedule), as
// parallel/schedule.h names it: one stage runs no pipelining; auto is 1F1B, interleaved with virtual_pipeline > 1.
#pragma once
#include "core/config/config.h"
#include "parallel/schedule.h"

namespace mt {

inline ScheduleKind training_schedule_kind(const ParallelConfig& p) {
  if (p.pipeline == 1 && p.virtual_pipeline == 1) return ScheduleKind::no_pipelining;
  switch (p.pipeline_schedule) {
    case PipelineSchedule::zb_h1:
      return ScheduleKind::zb_h1;
    case PipelineSchedule::automatic:
    case PipelineSchedule::one_f_one_b:
    case PipelineSchedule::interleaved:
      break;
  }
  return p.virtual_pipeline > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b;
}

}  // namespace mt
