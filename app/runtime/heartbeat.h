// heartbeat.h: every rank of a multi-rank job bumps a counter of its own in the rendezvous store once a period,
// from a thread with its own store connection. When a collective times out, the ranks whose counter has
// stopped moving (a stopped or frozen process) are named: the timeout is theirs, not the waiting rank's.
#pragma once
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/store/launch.h"
#include "parallel/store/store.h"

namespace mt::app {

class Heartbeat {
 public:
  // Connects its own client to the store at env.master_addr:master_port (within `timeout`) and starts beating.
  Heartbeat(const LaunchEnv& env, Millis period, Millis timeout);
  ~Heartbeat();  // stops the thread (at most one store request late) and marks this rank as exited
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Reads every rank's counter twice, three periods apart (through a fresh connection with short timeouts),
  // and says which did not move (ranks that exited on their own are not counted): " (ranks whose heartbeat stopped: [1])", " (the rendezvous store on rank 0
  // does not answer: rank 0 is stopped or gone)", or "" when every rank beats.
  std::string silent_ranks() const;

 private:
  void beat();

  LaunchEnv env_;
  Millis period_;
  std::shared_ptr<Store> store_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mt::app
