// checkpoint.h: the layout-independent checkpoint format and its commit protocol.
//
// A checkpoint is a directory SAVE_DIR/iter_NNNNNNN holding
//   metadata.yaml   format version, iteration, the resolved config, free-form state (scaler, RNG, data
//                   position) and the tensor index: per tensor its name, dtype and global shape, and per
//                   stored slice the file, byte offset, byte count, slice start and extent per dimension and
//                   a CRC-32 of the bytes;
//   rank_NNNNN.bin  the raw little-endian slices each rank wrote.
// SAVE_DIR/latest names the newest committed checkpoint directory.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/io/crc.h"  // crc32: the data files' and the metadata's checksums
#include "core/io/file_error.h"
#include "core/io/progress.h"
#include "core/tensor/tensor.h"

namespace mt {
namespace ckpt {
class CheckpointLease;  // save_dir.h
}

// Every checkpoint problem: names the directory or file and what is wrong. A FileError, as the file_io helpers'
// errors (core/io/file_io.h) that checkpoint code lets through are.
class CheckpointError : public FileError {
 public:
  using FileError::FileError;
};

// A checkpoint directory that is gone: not there when it was to be opened, or removed while it was (by the
// keep_last of the run that writes its save directory).
class CheckpointRemoved : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// One slice of a global tensor held by this rank: `data` (host, shape = extent) starts at `start`.
struct TensorSlice {
  std::string name;
  Shape global_shape;
  std::vector<int64_t> start;  // per dimension; empty means all zeros (the whole tensor)
  Tensor data;                 // its dtype is the stored dtype
};

struct CheckpointState {
  int64_t iteration = 0;
  std::string config_yaml;                    // the resolved config of the run that saved it
  std::map<std::string, std::string> values;  // scalar state: consumed samples, scaler, RNG, ...
};

// Writes one checkpoint with the commit protocol: everything goes to a temporary directory beside the
// final one, files are flushed (fsync) and read back to verify their checksums, then the directory is
// renamed into place and `latest` is replaced atomically; finally checkpoints beyond keep_last (0 = keep
// all) are removed, oldest first. A failure at any point leaves the previous checkpoints untouched and
// throws CheckpointError. Single-writer now; the per-rank split arrives with multi-rank training.
// Returns the committed directory. `progress` hears of each tensor written.
std::string save_checkpoint(const std::string& save_dir, const CheckpointState& state,
                            const std::vector<TensorSlice>& tensors, int64_t keep_last,
                            const ProgressHook& progress = {});

// Checks that `save_dir` can be created and written (creating it), so a run fails before training
// rather than at its first save. Throws CheckpointError.
void check_save_dir_writable(const std::string& save_dir);

// `path` itself when it holds metadata.yaml, else the checkpoint its `latest` names; nullopt when
// `path` has neither (no checkpoint yet). Throws CheckpointError when `latest` names a missing directory.
std::optional<std::string> resolve_checkpoint(const std::string& path);

// For resuming a run: resolve_checkpoint, except that a save directory holding iter_* checkpoints but no
// valid `latest` (missing, unreadable, empty, or naming a missing or incomplete directory) resumes from the
// newest checkpoint that opens and verifies, with a warning naming it and every one passed over; a run never
// starts over silently. Throws CheckpointError when checkpoints are there but none is complete.
std::optional<std::string> resolve_resume_checkpoint(const std::string& path);

class CheckpointReader;

// The checkpoint at `path` (a checkpoint, or the one a save directory's `latest` names) opened for reading. For
// the readers of a save directory that a live run may be writing (eval, generate, ckpt): the reader holds its
// checkpoint (ckpt::CheckpointLease) so the run's keep_last leaves it whole, and when the checkpoint `latest`
// named is removed before the hold is taken, `latest` is read again. Throws CheckpointError when there is no
// checkpoint, and CheckpointRemoved when `path` names a checkpoint directly that is gone.
CheckpointReader open_checkpoint(const std::string& path);

class MappedFile;  // core/io/mapped_file.h

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape global_shape;
};

// A committed checkpoint opened for reading; the metadata is parsed and checked on open, data is
// verified against its checksums as it is read. It holds the directory (ckpt::CheckpointLease) for its life.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const CheckpointState& state() const { return state_; }
  const std::vector<TensorInfo>& tensors() const { return infos_; }
  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws CheckpointError if absent
  // Fills `out` (host, any floating dtype, converted) with the region of tensor `name` starting at
  // `start` (empty: the origin) of extent out.shape(), assembling it from whichever stored slices cover it.
  void read(const std::string& name, Tensor& out, const std::vector<int64_t>& start = {}) const;
  // Verifies every stored byte against its checksum; throws CheckpointError naming the first bad tensor.
  void verify_all() const;
  // How many stored slices tensor `name` has (throws CheckpointError if absent).
  size_t num_slices(const std::string& name) const;
  // The identity of what this checkpoint stores for the tensors whose names start with `prefix`: a CRC-32 over
  // each one's name, dtype and global shape and each stored slice's start, extent and checksum, in name order.
  // Equal for a copy of the checkpoint, different when any of those bytes differ (or are sliced otherwise).
  // Reads only the metadata.
  uint32_t stored_checksum(const std::string& prefix = "") const;

 private:
  struct SliceRecord {
    std::string file;
    int64_t offset = 0, bytes = 0;
    std::vector<int64_t> start, extent;
    uint32_t crc = 0;
    mutable bool verified = false;  // checksum checked on first use (a reader is not shared across threads)
  };
  const MappedFile& file(const std::string& name) const;  // mapped on first use
  void verify(const std::string& tensor, const SliceRecord& s) const;
  std::string dir_;
  CheckpointState state_;
  std::vector<TensorInfo> infos_;
  std::map<std::string, std::vector<SliceRecord>> slices_;
  mutable std::map<std::string, std::shared_ptr<const MappedFile>> files_;
  std::shared_ptr<const ckpt::CheckpointLease> lease_;
};

}  // namespace mt
