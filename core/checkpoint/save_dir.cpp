#include "core/checkpoint/save_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/checkpoint/checkpoint.h"
#include "core/io/file_io.h"
#include "core/checkpoint/metadata.h"

namespace fs = std::filesystem;

namespace mt::ckpt {
namespace {

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) throw CheckpointError(fmt::format("{}: cannot list directory: {}", dir, ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec) throw CheckpointError(fmt::format("{}: cannot list directory: {}", dir, ec.message()));
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// "iter_0000100" -> 100; nullopt for anything else.
std::optional<int64_t> parse_iter_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "iter_") != 0 || name.size() > 5 + 18) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// The locks this process holds: canonical save_dir -> (fd of its lock file, how many SaveDirLocks share it).
std::map<std::string, std::pair<int, int>>& held_locks() {
  static std::map<std::string, std::pair<int, int>> locks;
  return locks;
}

std::string lock_key(const std::string& save_dir) {
  std::error_code ec;
  auto p = fs::weakly_canonical(save_dir, ec);
  return ec ? save_dir : p.string();
}

}  // namespace

SaveDirLock::SaveDirLock(const std::string& save_dir) {
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot create checkpoint directory: {}", save_dir, ec.message()));
  key_ = lock_key(save_dir);
  auto& locks = held_locks();
  if (auto it = locks.find(key_); it != locks.end()) {
    ++it->second.second;
    return;
  }
  const std::string path = io::join_path(save_dir, kLockFile);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) io::throw_os_error(path, "cannot open the save directory's lock file", errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    if (err == EWOULDBLOCK)
      throw CheckpointError(
          fmt::format("{}: checkpoint.save_dir is in use by another run{} (it holds {}); two runs "
                      "must not write one save_dir — give this run its own checkpoint.save_dir",
                      save_dir, pid.empty() ? "" : " (pid " + pid + ")", path));
    io::throw_os_error(path, "cannot lock the save directory", err);
  }
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    spdlog::warn("checkpoint: could not record this pid in {}", path);
  locks[key_] = {fd, 1};
}

CheckpointLease::CheckpointLease(const std::string& dir) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT) throw CheckpointRemoved(fmt::format("{}: checkpoint directory does not exist", dir));
    io::throw_os_error(dir, "cannot open the checkpoint directory", err);
  }
  if (::flock(fd_, LOCK_SH) != 0) {  // waits only while keep_last renames the directory away
    ::close(fd_);
    fd_ = -1;  // no flock on this filesystem: no hold
    return;
  }
  // Held, but perhaps of a directory keep_last renamed away while this waited: the path must still be it.
  struct stat held {
  }, now{};
  if (::fstat(fd_, &held) != 0 || ::stat(dir.c_str(), &now) != 0 || held.st_ino != now.st_ino ||
      held.st_dev != now.st_dev) {
    ::close(fd_);
    fd_ = -1;
    throw CheckpointRemoved(fmt::format("{}: removed while it was being opened", dir));
  }
}

CheckpointLease::~CheckpointLease() {
  if (fd_ >= 0) ::close(fd_);
}

SaveDirLock::~SaveDirLock() {
  auto& locks = held_locks();
  auto it = locks.find(key_);
  if (it == locks.end() || --it->second.second > 0) return;
  ::close(it->second.first);  // releases the flock
  locks.erase(it);
}

bool SaveDirLock::held(const std::string& save_dir) { return held_locks().count(lock_key(save_dir)) > 0; }

void remove_stale_tmp(const std::string& save_dir) {
  const std::string replaced = std::string(kTmpPrefix) + "replaced.";
  for (const auto& name : entries(save_dir)) {
    if (name.rfind(kTmpPrefix, 0) != 0) continue;
    std::string path = io::join_path(save_dir, name);
    if (name.rfind(replaced, 0) == 0) {
      // ".tmp.replaced.iter_N.<pid>": the old copy of a checkpoint that a crashed save was replacing.
      std::string rest = name.substr(replaced.size());
      std::string original = io::join_path(save_dir, rest.substr(0, rest.rfind('.')));
      if (io::path_kind(original) == io::PathKind::missing && ::rename(path.c_str(), original.c_str()) == 0) {
        spdlog::warn("checkpoint: restored {} from an interrupted replacement", original);
        continue;
      }
    }
    if (!io::remove_tree(path))
      spdlog::warn("checkpoint: could not remove stale {}", path);
    else
      spdlog::info("checkpoint: removed {} left by an interrupted save", path);
  }
}

void install_dir(const std::string& save_dir, const std::string& tmp, const std::string& final) {
  switch (io::path_kind(final)) {
    case io::PathKind::missing:
      if (::rename(tmp.c_str(), final.c_str()) != 0)
        io::throw_os_error(final, "cannot rename " + tmp + " to it", errno);
      io::fsync_dir(save_dir);
      return;
    case io::PathKind::directory:
      break;
    default:
      throw CheckpointError(fmt::format("{}: exists and is not a directory; remove it to save here", final));
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) == 0) {
    io::fsync_dir(save_dir);
    if (!io::remove_tree(tmp)) spdlog::warn("checkpoint: could not remove the replaced checkpoint now at {}", tmp);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) io::throw_os_error(final, "cannot swap in " + tmp, errno);
  // No atomic exchange here: rename the old one aside (remove_stale_tmp restores it after a crash).
  std::string name = fs::path(final).filename().string();
  std::string aside = io::join_path(save_dir, fmt::format("{}replaced.{}.{}", kTmpPrefix, name, ::getpid()));
  if (::rename(final.c_str(), aside.c_str()) != 0)
    io::throw_os_error(final, "cannot rename it aside to " + aside, errno);
  if (::rename(tmp.c_str(), final.c_str()) != 0) {
    int err = errno;
    ::rename(aside.c_str(), final.c_str());
    io::throw_os_error(final, "cannot rename " + tmp + " to it", err);
  }
  io::fsync_dir(save_dir);
  if (!io::remove_tree(aside)) spdlog::warn("checkpoint: could not remove the replaced checkpoint {}", aside);
}

void write_latest(const std::string& save_dir, const std::string& name) {
  // The temporary carries kTmpPrefix, so remove_stale_tmp takes it if a crash leaves it.
  io::write_file_atomically(io::join_path(save_dir, kLatestFile), name + "\n",
                            io::join_path(save_dir, fmt::format("{}latest.{}", kTmpPrefix, ::getpid())));
}

std::optional<std::string> read_latest(const std::string& save_dir) {
  std::string path = io::join_path(save_dir, kLatestFile);
  io::PathKind kind = io::path_kind(path);
  if (kind == io::PathKind::missing) return std::nullopt;
  if (kind != io::PathKind::file) throw CheckpointError(fmt::format("{}: is not a file", path));
  std::string text = io::read_text_file(path);
  auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) throw CheckpointError(fmt::format("{}: is empty (expected a checkpoint name)", path));
  auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& save_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& name : entries(save_dir)) {
    auto it = parse_iter_name(name);
    if (it && io::path_kind(io::join_path(save_dir, name)) == io::PathKind::directory) out.emplace_back(*it, name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void apply_keep_last(const std::string& save_dir, int64_t keep_last, const std::string& keep) {
  if (keep_last <= 0) return;
  std::optional<std::string> latest;
  try {
    latest = read_latest(save_dir);
  } catch (const FileError& e) {
    spdlog::warn("checkpoint: keep_last skipped: {}", e.what());
    return;
  }
  auto all = list_checkpoints(save_dir);
  int64_t excess = static_cast<int64_t>(all.size()) - keep_last;
  for (int64_t i = 0; i < static_cast<int64_t>(all.size()) && excess > 0; ++i) {
    const std::string& name = all[i].second;
    if (name == keep || (latest && name == *latest)) continue;
    const std::string path = io::join_path(save_dir, name);
    --excess;
    // A reader's CheckpointLease keeps it: the exclusive lock is taken without waiting, and the checkpoint is
    // renamed aside while it is held, so a reader about to take its hold finds the path gone and reads
    // `latest` again. A crash before the removal leaves a `.tmp.*` entry that the next run removes.
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      ::close(fd);
      spdlog::info("checkpoint: kept {} beyond keep_last={}: a reader has it open (a later save removes it)", path,
                   keep_last);
      continue;
    }
    const std::string aside = io::join_path(save_dir, fmt::format("{}pruned.{}.{}", kTmpPrefix, name, ::getpid()));
    const bool moved = ::rename(path.c_str(), aside.c_str()) == 0;
    if (fd >= 0) ::close(fd);
    if (io::remove_tree(moved ? aside : path))
      spdlog::info("checkpoint: removed {} (keep_last={})", path, keep_last);
    else
      spdlog::warn("checkpoint: could not remove {} (keep_last={})", moved ? aside : path, keep_last);
  }
}

}  // namespace mt::ckpt

namespace mt {

void check_save_dir_writable(const std::string& save_dir) {
  using namespace ckpt;
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot create checkpoint directory: {}", save_dir, ec.message()));
  if (io::path_kind(save_dir) != io::PathKind::directory)
    throw CheckpointError(fmt::format("{}: checkpoint directory exists and is not a directory", save_dir));
  std::string probe = io::join_path(save_dir, fmt::format("{}probe.{}", kTmpPrefix, ::getpid()));
  ::unlink(probe.c_str());
  try {
    io::write_file_durably(probe, "megatrain\n");
  } catch (const FileError& e) {
    ::unlink(probe.c_str());
    throw CheckpointError(fmt::format("checkpoint directory is not writable: {}", e.what()));
  }
  ::unlink(probe.c_str());
}

std::optional<std::string> resolve_checkpoint(const std::string& path) {
  using namespace ckpt;
  switch (io::path_kind(path)) {
    case io::PathKind::missing:
      return std::nullopt;
    case io::PathKind::directory:
      break;
    default:
      throw CheckpointError(fmt::format("{}: is not a directory (expected a checkpoint or save directory)", path));
  }
  if (io::path_kind(io::join_path(path, kMetadataFile)) != io::PathKind::missing) return path;
  auto latest = read_latest(path);
  if (!latest) return std::nullopt;
  std::string dir = (*latest)[0] == '/' ? *latest : io::join_path(path, *latest);
  if (io::path_kind(dir) != io::PathKind::directory)  // a live run's keep_last may have removed it since
    throw CheckpointRemoved(fmt::format("{}/{}: names {}, which does not exist", path, kLatestFile, dir));
  return dir;
}

}  // namespace mt

namespace mt {

std::optional<std::string> resolve_resume_checkpoint(const std::string& path) {
  using namespace ckpt;
  std::string why;
  try {
    auto dir = resolve_checkpoint(path);
    if (dir && (*dir == path || io::path_kind(io::join_path(*dir, kMetadataFile)) == io::PathKind::file)) return dir;
    why = dir ? fmt::format("{}/{} names {}, which has no {}", path, kLatestFile, *dir, kMetadataFile)
              : fmt::format("{}/{} is missing", path, kLatestFile);
  } catch (const FileError& e) {
    if (io::path_kind(path) != io::PathKind::directory) throw;
    why = e.what();
  }
  if (io::path_kind(path) != io::PathKind::directory) return std::nullopt;  // no save directory yet
  auto all = list_checkpoints(path);
  if (all.empty()) return std::nullopt;  // a fresh save directory: nothing to resume
  std::vector<std::string> passed;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string dir = io::join_path(path, it->second);
    try {
      CheckpointReader reader(dir);
      reader.verify_all();
    } catch (const FileError& e) {
      spdlog::warn("checkpoint: passing over {}: {}", dir, e.what());
      passed.push_back(it->second);
      continue;
    }
    spdlog::warn(
        "checkpoint: {} but the directory holds checkpoints: resuming from {}, the newest complete one "
        "(verified){}",
        why, dir, passed.empty() ? "" : fmt::format("; passed over {}", fmt::join(passed, ", ")));
    return dir;
  }
  throw CheckpointError(
      fmt::format("{}: {} and none of its checkpoints ({}) is complete; refusing to start over "
                  "(set checkpoint.load: none to train from scratch, or another save_dir)",
                  path, why, fmt::join(passed, ", ")));
}

}  // namespace mt
