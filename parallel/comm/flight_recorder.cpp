// flight_recorder.cpp: the ring of this process's last collectives and its JSON dump (flight_recorder.h).
#include "parallel/comm/flight_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace mt {

namespace {

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

struct Ring {
  mutable std::mutex mu;
  std::vector<CollectiveRecord> slots = std::vector<CollectiveRecord>(FlightRecorder::kCapacity);
  uint64_t next = 0;  // slots written so far: the next slot is next % capacity
};

Ring& ring() {
  static Ring r;
  return r;
}

}  // namespace

uint64_t FlightRecorder::queued(const std::string& group, int64_t seq, const std::string& op, int64_t bytes) {
  Ring& r = ring();
  const double now = unix_now();
  std::lock_guard lock(r.mu);
  const uint64_t slot = r.next++;
  r.slots[slot % kCapacity] = {.group = group, .seq = seq, .op = op, .bytes = bytes, .queued_s = now};
  return slot;
}

void FlightRecorder::finished(uint64_t slot) {
  Ring& r = ring();
  const double now = unix_now();
  std::lock_guard lock(r.mu);
  if (slot + kCapacity >= r.next) r.slots[slot % kCapacity].finished_s = now;  // not overwritten since
}

std::vector<CollectiveRecord> FlightRecorder::records() const {
  Ring& r = ring();
  std::lock_guard lock(r.mu);
  const uint64_t first = r.next > kCapacity ? r.next - kCapacity : 0;
  std::vector<CollectiveRecord> out;
  out.reserve(r.next - first);
  for (uint64_t s = first; s < r.next; ++s) out.push_back(r.slots[s % kCapacity]);
  return out;
}

bool FlightRecorder::dump(const std::string& path, int rank, int world, const std::string& reason) const {
  nlohmann::json ops = nlohmann::json::array();
  for (const CollectiveRecord& c : records())
    ops.push_back({{"group", c.group},
                   {"seq", c.seq},
                   {"op", c.op},
                   {"bytes", c.bytes},
                   {"queued_s", c.queued_s},
                   {"finished_s", c.finished_s}});
  const nlohmann::json doc = {
      {"rank", rank}, {"world", world}, {"reason", reason}, {"dumped_s", unix_now()}, {"collectives", ops}};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << doc.dump(1) << "\n";
    if (!f.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

FlightRecorder& flight_recorder() {
  static FlightRecorder r;
  return r;
}

namespace {
thread_local int64_t t_comm_wait_ns = 0;
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

int64_t this_thread_comm_wait_ns() { return t_comm_wait_ns; }
CommWaitTimer::CommWaitTimer() : start_ns_(steady_ns()) {}
CommWaitTimer::~CommWaitTimer() { t_comm_wait_ns += steady_ns() - start_ns_; }

}  // namespace mt

namespace mt {

namespace {

// The global ranks of a group named "kind[a,b,c]" (comm names); every rank of the job for a name without a list.
std::vector<int> members_of(const std::string& group, int world) {
  std::vector<int> out;
  const size_t open = group.find('['), close = group.rfind(']');
  if (open == std::string::npos || close == std::string::npos || close < open) {
    for (int r = 0; r < world; ++r) out.push_back(r);
    return out;
  }
  std::string list = group.substr(open + 1, close - open - 1);
  size_t at = 0;
  while (at < list.size()) {
    const size_t comma = list.find(',', at);
    out.push_back(std::stoi(list.substr(at, comma == std::string::npos ? std::string::npos : comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += fmt::format("{}{}", out.empty() ? "" : ", ", r);
  return out;
}

}  // namespace

FlightDump read_flight_dump(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(fmt::format("{}: cannot read", path));
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    FlightDump d{.rank = j.at("rank").get<int>(),
                 .world = j.at("world").get<int>(),
                 .reason = j.at("reason").get<std::string>(),
                 .dumped_s = j.at("dumped_s").get<double>()};
    for (const nlohmann::json& c : j.at("collectives"))
      d.collectives.push_back({.group = c.at("group").get<std::string>(),
                               .seq = c.at("seq").get<int64_t>(),
                               .op = c.at("op").get<std::string>(),
                               .bytes = c.at("bytes").get<int64_t>(),
                               .queued_s = c.at("queued_s").get<double>(),
                               .finished_s = c.at("finished_s").get<double>()});
    return d;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{}: not a flight record: {}", path, e.what()));
  }
}

HangReport analyse_flight_dumps(const std::vector<FlightDump>& dumps) {
  HangReport report;
  int world = 0;
  std::map<int, const FlightDump*> by_rank;
  for (const FlightDump& d : dumps) {
    world = std::max(world, d.world);
    by_rank[d.rank] = &d;
  }
  std::vector<int> missing;
  for (int r = 0; r < world; ++r)
    if (!by_rank.contains(r)) missing.push_back(r);
  report.lines.push_back(
      fmt::format("flight records of {} of {} ranks{}", by_rank.size(), world,
                  missing.empty() ? "" : fmt::format(" (none from rank(s) {})", join_ranks(missing))));
  // Per rank and group: the last collective issued, and the first one issued but never finished (the wait).
  struct Seen {
    int64_t last = 0;
    const CollectiveRecord* waiting = nullptr;
  };
  std::map<std::string, std::map<int, Seen>> groups;
  for (const auto& [rank, d] : by_rank)
    for (const CollectiveRecord& c : d->collectives) {
      if (c.seq == 0) continue;  // point to point: not in the group's order
      Seen& s = groups[c.group][rank];
      s.last = std::max(s.last, c.seq);
      if (c.finished_s == 0 && (!s.waiting || c.seq < s.waiting->seq)) s.waiting = &c;
    }
  // A rank behind on one group but itself waiting in another collective is blocked, not the cause (its gradient
  // reducer waits for the missing rank too); the suspects are the ranks that left no record or wait in nothing.
  std::map<int, const CollectiveRecord*> blocked_in;
  for (const auto& [rank, d] : by_rank)
    for (const CollectiveRecord& c : d->collectives)
      if (c.finished_s == 0) blocked_in[rank] = &c;
  std::set<int> suspects, blocked_behind;
  for (const auto& [group, ranks] : groups) {
    // The earliest collective of the group that some rank waited in.
    const CollectiveRecord* wait = nullptr;
    std::vector<int> waiters;
    for (const auto& [rank, s] : ranks)
      if (s.waiting && (!wait || s.waiting->seq < wait->seq)) wait = s.waiting;
    if (!wait) continue;
    std::vector<int> behind, unknown;
    for (const auto& [rank, s] : ranks)
      if (s.waiting && s.waiting->seq == wait->seq) waiters.push_back(rank);
    for (int m : members_of(group, world)) {
      const auto it = ranks.find(m);
      if (!by_rank.contains(m))
        unknown.push_back(m);
      else if (it == ranks.end() || it->second.last < wait->seq)
        behind.push_back(m);
    }
    std::string line = fmt::format("{}: rank(s) {} waited in {} #{} ({} bytes)", group, join_ranks(waiters), wait->op,
                                   wait->seq, wait->bytes);
    if (!behind.empty()) {
      line += fmt::format("; rank(s) {} never issued it", join_ranks(behind));
      for (int r : behind) {
        const auto it = ranks.find(r);
        line += it == ranks.end() ? fmt::format(" (rank {}: nothing on this group", r)
                                  : fmt::format(" (rank {}: its last was #{}", r, it->second.last);
        const auto b = blocked_in.find(r);
        line += b == blocked_in.end()
                    ? ")"
                    : fmt::format(", blocked in {} #{} on {})", b->second->op, b->second->seq, b->second->group);
        (b == blocked_in.end() ? suspects : blocked_behind).insert(r);
      }
    }
    if (!unknown.empty())
      line += fmt::format("; rank(s) {} left no record (stopped, killed or hung)", join_ranks(unknown));
    report.lines.push_back(line);
    suspects.insert(unknown.begin(), unknown.end());
  }
  if (suspects.empty()) suspects = blocked_behind;  // every laggard is blocked: name them all the same
  report.suspects.assign(suspects.begin(), suspects.end());
  for (const auto& [rank, d] : by_rank) {
    const CollectiveRecord* last = d->collectives.empty() ? nullptr : &d->collectives.back();
    report.lines.push_back(fmt::format("rank {}: {}; last op {}", rank, d->reason.substr(0, 200),
                                       last ? fmt::format("{} #{} on {}{}", last->op, last->seq, last->group,
                                                          last->finished_s == 0 ? " (unfinished)" : "")
                                            : std::string("none")));
  }
  report.lines.push_back(report.suspects.empty()
                             ? std::string("no rank stands out: every member of each group reached its collectives")
                             : fmt::format("suspect rank(s): {}", join_ranks(report.suspects)));
  return report;
}

}  // namespace mt
