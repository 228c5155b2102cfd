// gloo_store_adapter.h: Gloo's rendezvous::Store on top of our Store, under a key prefix, with blocking
// get/wait bounded by a timeout (Gloo expects get to block until the key exists).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "parallel/store/store.h"

namespace mt {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  // Every key Gloo uses becomes prefix + key in `store`; get and wait without a timeout use `timeout`.
  GlooStoreAdapter(std::shared_ptr<mt::Store> store, std::string prefix, Millis timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  const std::string& prefix() const { return prefix_; }

 private:
  std::shared_ptr<mt::Store> store_;
  std::string prefix_;
  Millis timeout_;
};

}  // namespace mt
