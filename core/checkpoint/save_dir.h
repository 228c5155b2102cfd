// save_dir.h: the layout of a save directory: iter_NNNNNNN checkpoints, the `latest` marker, temporary
// entries named `.tmp.*`, and the operations that change them safely.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mt::ckpt {

inline constexpr const char* kLatestFile = "latest";
inline constexpr const char* kTmpPrefix = ".tmp.";

inline constexpr const char* kLockFile = ".lock";

// Exclusive use of a save directory by one run: an flock on SAVE_DIR/.lock (holding the holder's pid), kept
// for the object's life. Two runs writing one save_dir would delete each other's temporary directories and
// `latest`; the second is refused with CheckpointError naming the directory and the pid holding it. Locks of
// one process nest (a second SaveDirLock on the same directory in the same process shares the first).
// The lock file stays behind (removing it would race with a run about to lock it).
class SaveDirLock {
 public:
  explicit SaveDirLock(const std::string& save_dir);  // creates save_dir if needed
  ~SaveDirLock();
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;
  // Whether this process holds the lock of save_dir.
  static bool held(const std::string& save_dir);

 private:
  std::string key_;
};

// A reader's hold on one checkpoint directory, for the object's life: a shared flock on the directory itself.
// apply_keep_last removes a checkpoint only when it gets the exclusive lock at once, so a checkpoint being read
// (`eval`, `generate`, `ckpt` on the save_dir of a live run with keep_last 1) stays whole until a later save
// removes it. Throws CheckpointRemoved when `dir` does not exist or was removed while the hold was taken. Where
// the filesystem has no flock, there is no hold (and nothing fails for it).
class CheckpointLease {
 public:
  explicit CheckpointLease(const std::string& dir);
  ~CheckpointLease();
  CheckpointLease(const CheckpointLease&) = delete;
  CheckpointLease& operator=(const CheckpointLease&) = delete;

 private:
  int fd_ = -1;
};

// Removes what crashed saves left behind: `.tmp.*` entries. Only safe while holding the SaveDirLock: the
// `.tmp.*` entries of a live run look the same. A checkpoint that was renamed aside to be
// replaced (`.tmp.replaced.iter_N.<pid>`) is put back when its place is empty.
void remove_stale_tmp(const std::string& save_dir);

// Renames the complete directory `tmp` to `final` (both in save_dir). An existing `final` directory is
// replaced: swapped atomically where the filesystem can (renameat2 RENAME_EXCHANGE), else renamed aside
// first; the old one is removed afterwards.
void install_dir(const std::string& save_dir, const std::string& tmp, const std::string& final);

// Points `latest` at `name` atomically (tmp file, fsync, rename, fsync of the directory).
void write_latest(const std::string& save_dir, const std::string& name);
// The name `latest` holds; nullopt when there is no `latest`. Throws CheckpointError when it is unreadable
// or empty.
std::optional<std::string> read_latest(const std::string& save_dir);

// The iter_* directories of save_dir as (iteration, name), oldest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& save_dir);

// Removes checkpoints beyond the newest keep_last (0: keep all), oldest first, never `keep` nor the one
// `latest` names, nor one a reader holds (CheckpointLease: a later call removes it). Failures to remove are
// logged, not thrown: the new checkpoint is already committed.
void apply_keep_last(const std::string& save_dir, int64_t keep_last, const std::string& keep);

}  // namespace mt::ckpt
