// shared_rounds.cpp: the segment, its rendezvous through the store, and the rounds' arrival counters with a
// futex for the waiting (shared_rounds.h).
#include "parallel/comm/shared_rounds.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <fstream>
#include <new>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

namespace mt {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMagic = 0x6d74'7368'6d72'6e64ull;  // "mtshmrnd"
constexpr size_t kHeaderBytes = 128;
constexpr size_t kMemberBytes = 64;
constexpr auto kLivenessPeriod = std::chrono::milliseconds(50);
constexpr int kYieldsBeforeSleeping = 8;

std::string errno_text(const char* call) { return fmt::format("{}: {}", call, std::strerror(errno)); }

// What two processes must share to share a segment by name: the host and its boot, the pid namespace (the
// liveness checks use pids) and the mount namespace (/dev/shm).
std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  auto inode = [](const char* path) {
    struct stat st {};
    return ::stat(path, &st) == 0 ? std::to_string(st.st_ino) : std::string("?");
  };
  return fmt::format("{}/{}/{}/{}", host, boot, inode("/proc/self/ns/pid"), inode("/proc/self/ns/mnt"));
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

struct SharedRounds::Segment {
  uint64_t magic;
  uint32_t size;
  uint32_t slot_bytes;
  alignas(64) std::atomic<uint32_t> epoch;  // the futex word: bumped at every arrival and failure
  std::atomic<uint32_t> sleepers;           // ranks in (or entering) a futex wait on epoch
  std::atomic<int32_t> failed;              // -1, or the first rank that gave up

  struct Member {
    std::atomic<uint64_t> arrived;   // rounds this rank has published
    std::atomic<uint64_t> bytes[2];  // the size of its part in the last round of each slot
    std::atomic<int32_t> pid;
  };
  static size_t slots_offset(int n) { return round_up(kHeaderBytes + kMemberBytes * static_cast<size_t>(n), 4096); }
  static size_t bytes(int n) { return slots_offset(n) + 2 * static_cast<size_t>(n) * kSlotBytes; }
  Member& member(int r) {
    return *reinterpret_cast<Member*>(reinterpret_cast<std::byte*>(this) + kHeaderBytes + kMemberBytes * r);
  }
  std::byte* slot(uint64_t round, int r) {
    return reinterpret_cast<std::byte*>(this) + slots_offset(static_cast<int>(size)) +
           ((round & 1) * size + static_cast<size_t>(r)) * kSlotBytes;
  }
  uint32_t* futex_word() { return reinterpret_cast<uint32_t*>(&epoch); }
};
static_assert(sizeof(SharedRounds::Segment) <= kHeaderBytes);
static_assert(sizeof(SharedRounds::Segment::Member) <= kMemberBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(std::atomic<uint64_t>::is_always_lock_free);

SharedRounds::SharedRounds(int rank, std::vector<int> members, std::chrono::milliseconds timeout)
    : rank_(rank), members_(std::move(members)), timeout_(timeout) {}

SharedRounds::~SharedRounds() {
  for (int fd : peer_fds_)
    if (fd >= 0) ::close(fd);
  if (seg_) ::munmap(seg_, map_bytes_);
}

std::string SharedRounds::who(int r) const { return fmt::format("rank {} (global {})", r, members_.at(r)); }

std::unique_ptr<SharedRounds> SharedRounds::join(Store& store, const std::string& prefix, int rank,
                                                 const std::vector<int>& members, bool wanted,
                                                 std::chrono::milliseconds timeout, std::string* why_not) {
  const int n = static_cast<int>(members.size());
  auto refuse = [&](std::string why) -> std::unique_ptr<SharedRounds> {
    if (why_not) *why_not = std::move(why);
    return nullptr;
  };
  if (n < 2) return refuse("a group of one rank");
  const std::string identity = host_identity();
  store.set(fmt::format("{}host/{}", prefix, rank), text_bytes(wanted ? identity : "-"));

  // Rank 0 decides, creates the segment and names it (or says why not); the others map it and report.
  auto rounds = std::unique_ptr<SharedRounds>(new SharedRounds(rank, members, timeout));
  const size_t total = Segment::bytes(n);
  std::string name, verdict;
  struct Unlink {  // rank 0 removes the name on every way out: once all have mapped it, nothing needs it
    std::string name;
    ~Unlink() {
      if (!name.empty()) ::shm_unlink(name.c_str());
    }
  } unlink;
  auto map = [&](int fd) -> std::string {
    void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return errno_text("mmap");
    rounds->seg_ = static_cast<Segment*>(p);
    rounds->map_bytes_ = total;
    return "";
  };
  if (rank == 0) {
    for (int r = 0; r < n && verdict.empty(); ++r) {
      const std::string theirs = bytes_text(store.get(fmt::format("{}host/{}", prefix, r), timeout));
      if (theirs == "-")
        verdict = fmt::format("{} has parallel.gloo_shared_memory false", rounds->who(r));
      else if (!wanted)
        verdict = "rank 0 has parallel.gloo_shared_memory false";
      else if (theirs != identity)
        verdict = fmt::format("{} runs on another host or in another container", rounds->who(r));
    }
    const bool agreed = !verdict.empty();  // the verdict is the members' settings or hosts, not a failure here
    if (verdict.empty()) {
      std::random_device rd;
      name = fmt::format("/megatrain-{}-{:08x}{:08x}", ::getpid(), rd(), rd());
      int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd < 0) {
        verdict = errno_text("shm_open");
      } else {
        unlink.name = name;
        // posix_fallocate takes the pages now, so a full /dev/shm is an error here, not a SIGBUS in a round.
        if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); e != 0) {
          ::close(fd);
          verdict = fmt::format("posix_fallocate of {} bytes in /dev/shm: {}", total, std::strerror(e));
        } else {
          verdict = map(fd);
        }
      }
      if (verdict.empty()) {
        Segment* s = new (rounds->seg_) Segment{};
        s->magic = kMagic;
        s->size = static_cast<uint32_t>(n);
        s->slot_bytes = static_cast<uint32_t>(kSlotBytes);
        s->failed.store(-1);
        for (int r = 0; r < n; ++r) new (&s->member(r)) Segment::Member{};
        s->member(0).pid.store(::getpid());
      }
    }
    if (!verdict.empty() && !agreed)  // this host could not give the segment: say so, it costs speed
      spdlog::warn("{}: small collectives stay on Gloo's TCP: {}", prefix, verdict);
    store.set(prefix + "segment", text_bytes(verdict.empty() ? name : "!" + verdict));
    if (!verdict.empty()) return refuse(verdict);
    for (int r = 1; r < n; ++r) {
      const std::string report = bytes_text(store.get(fmt::format("{}attached/{}", prefix, r), timeout));
      if (report != "ok" && verdict.empty())
        verdict = fmt::format("{} cannot map the segment: {}", rounds->who(r), report);
    }
    store.set(prefix + "ready", text_bytes(verdict.empty() ? "ok" : verdict));
  } else {
    name = bytes_text(store.get(prefix + "segment", timeout));
    if (name.starts_with("!")) return refuse(name.substr(1));
    std::string report;
    int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    report = fd < 0 ? errno_text("shm_open") : map(fd);
    if (report.empty() && (rounds->seg_->magic != kMagic || rounds->seg_->size != static_cast<uint32_t>(n)))
      report = fmt::format("{} is not this group's segment", name);
    if (report.empty())
      rounds->seg_->member(rank).pid.store(::getpid());
    else
      spdlog::warn("{}: small collectives stay on Gloo's TCP: {}", prefix, report);
    store.set(fmt::format("{}attached/{}", prefix, rank), text_bytes(report.empty() ? "ok" : report));
    verdict = bytes_text(store.get(prefix + "ready", timeout));
    if (verdict == "ok") verdict.clear();
  }
  if (!verdict.empty()) return refuse(verdict);

  // Every pid is written before "ready": watch the other processes, to fail at once when one exits.
  const int self = ::getpid();
  for (int r = 0; r < n; ++r) {
    const int pid = r == rank ? self : rounds->seg_->member(r).pid.load();
    int fd = -1;
#ifdef SYS_pidfd_open
    if (pid != self) fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
    rounds->peer_fds_.push_back(fd);
    rounds->peer_pids_.push_back(pid);
  }
  return rounds;
}

void SharedRounds::round(const void* mine, size_t bytes, bool same_size) {
  if (bytes > kSlotBytes)
    throw std::invalid_argument(fmt::format("shared-memory round of {} bytes (at most {})", bytes, kSlotBytes));
  const uint64_t k = rounds_++;
  if (bytes > 0) std::memcpy(seg_->slot(k, rank_), mine, bytes);
  seg_->member(rank_).bytes[k & 1].store(bytes);
  seg_->member(rank_).arrived.store(k + 1);
  seg_->epoch.fetch_add(1);
  if (seg_->sleepers.load() > 0) ::syscall(SYS_futex, seg_->futex_word(), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  wait_for_all(k + 1);
  if (same_size)
    for (int r = 0; r < size(); ++r)
      if (part_bytes(r) != bytes)
        give_up(
            fmt::format("{} took part with {} bytes, {} with {} bytes: the ranks disagree on the collective's size (do "
                        "all ranks run the same binary and config?)",
                        who(r), part_bytes(r), who(rank_), bytes));
}

const std::byte* SharedRounds::part(int j) const { return seg_->slot(rounds_ - 1, j); }
size_t SharedRounds::part_bytes(int j) const { return seg_->member(j).bytes[(rounds_ - 1) & 1].load(); }

// Sleeps on the epoch only after a few yields (with more ranks than cores, a yield lets the rank we wait for run);
// a sleeper counts itself in `sleepers` before it checks the arrivals once more, so an arrival after that check
// bumps the epoch the futex compares against, or sees the sleeper and wakes it.
void SharedRounds::wait_for_all(uint64_t target) {
  const int n = size();
  auto all_arrived = [&] {
    for (int r = 0; r < n; ++r)
      if (seg_->member(r).arrived.load() < target) return false;
    return true;
  };
  const auto start = Clock::now();
  auto next_check = start + kLivenessPeriod;
  for (int yields = 0;; ++yields) {
    if (all_arrived()) return;  // a complete round stands even if a peer has given up since
    if (int failed = seg_->failed.load(); failed >= 0 && failed != rank_)
      throw SharedRoundError(fmt::format("{} gave up first (its own error says why)", who(failed)));
    const auto now = Clock::now();
    if (now - start >= timeout_) {
      std::vector<std::string> late;
      for (int r = 0; r < n; ++r)
        if (seg_->member(r).arrived.load() < target) late.push_back(who(r));
      give_up(fmt::format("timed out waiting in shared memory for {}", fmt::join(late, ", ")));
    }
    if (now >= next_check) {
      if (std::string gone = exited_peers(); !gone.empty()) give_up(gone);
      next_check = now + kLivenessPeriod;
    }
    if (yields < kYieldsBeforeSleeping) {
      ::sched_yield();
      continue;
    }
    const uint32_t epoch = seg_->epoch.load();
    seg_->sleepers.fetch_add(1);
    if (!all_arrived() && seg_->failed.load() < 0) {
      auto left = std::min<Clock::duration>(kLivenessPeriod, timeout_ - (now - start));
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      struct timespec ts {
        static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)
      };
      ::syscall(SYS_futex, seg_->futex_word(), FUTEX_WAIT, epoch, &ts, nullptr, 0);
    }
    seg_->sleepers.fetch_sub(1);
  }
}

std::string SharedRounds::exited_peers() const {
  std::vector<std::string> gone;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_ || peer_pids_[r] == peer_pids_[rank_]) continue;
    bool exited = false;
    if (peer_fds_[r] >= 0) {
      struct pollfd p {
        peer_fds_[r], POLLIN, 0
      };
      exited = ::poll(&p, 1, 0) > 0;  // a pidfd reads ready once its process has exited (reaped or not)
    } else {
      exited = ::kill(peer_pids_[r], 0) != 0 && errno == ESRCH;
    }
    if (exited) gone.push_back(fmt::format("{} (pid {}) exited", who(r), peer_pids_[r]));
  }
  return gone.empty() ? "" : fmt::format("{}", fmt::join(gone, ", "));
}

void SharedRounds::give_up(const std::string& why) {
  abandon();
  throw SharedRoundError(why);
}

void SharedRounds::abandon() noexcept {
  int32_t none = -1;
  seg_->failed.compare_exchange_strong(none, rank_);
  seg_->epoch.fetch_add(1);
  ::syscall(SYS_futex, seg_->futex_word(), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace mt
