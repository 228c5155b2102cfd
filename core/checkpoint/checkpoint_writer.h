// checkpoint_writer.h: the steps of save_checkpoint, split so that several ranks can write one checkpoint.
//
//   rank 0:     tmp = begin_checkpoint(save_dir, iteration)          (share `tmp` with the other ranks)
//   every rank: write_rank_files(tmp, rank, this rank's slices)      (its data file + index fragment)
//   barrier     (every rank has flushed and verified its files)
//   rank 0:     commit_checkpoint(save_dir, tmp, state, num_ranks, keep_last)
//   on failure anywhere: rank 0 calls abort_checkpoint(tmp).
// save_checkpoint (checkpoint.h) runs these steps for a single writer.
#pragma once
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/io/progress.h"

namespace mt {

std::string checkpoint_dir_name(int64_t iteration);  // "iter_0000100"

// Creates SAVE_DIR (if needed), removes stale `.tmp.*` entries of crashed saves (only when this process holds
// the save_dir's ckpt::SaveDirLock, see save_dir.h) and creates the empty
// temporary directory SAVE_DIR/.tmp.iter_NNNNNNN.<pid>, which it returns.
std::string begin_checkpoint(const std::string& save_dir, int64_t iteration);

// Writes rank_NNNNN.bin (the slices, raw little-endian, 64-byte aligned) and rank_NNNNN.index.yaml (their
// index) into tmp_dir, fsyncs both, then reopens the data file and verifies every slice's CRC-32. A tensor
// may appear several times (disjoint slices of one global tensor). Throws CheckpointError. `progress` hears of
// each slice written.
void write_rank_files(const std::string& tmp_dir, int rank, const std::vector<TensorSlice>& tensors,
                      const ProgressHook& progress = {});

// Merges the index fragments of ranks [0, num_ranks) into metadata.yaml, fsyncs it and the directory,
// reopens and checks the metadata against the data files, renames tmp_dir to SAVE_DIR/iter_NNNNNNN
// (replacing an existing one safely), replaces `latest` atomically and applies keep_last. Returns the
// committed directory. Throws CheckpointError; tmp_dir is left for the caller to abort.
std::string commit_checkpoint(const std::string& save_dir, const std::string& tmp_dir, const CheckpointState& state,
                              int num_ranks, int64_t keep_last);

// Removes the temporary directory of a failed save (never throws).
void abort_checkpoint(const std::string& tmp_dir) noexcept;

}  // namespace mt
