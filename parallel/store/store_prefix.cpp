// store_prefix.cpp: a view of another store with every key prefixed by "prefix/", so one store serves many
// process groups without their keys colliding.
#include "parallel/store/store.h"

namespace mt {
namespace {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
      : prefix_(std::move(prefix) + "/"), inner_(std::move(inner)) {}

  void set(const std::string& key, const Bytes& value) override { inner_->set(prefix_ + key, value); }
  Bytes get(const std::string& key, Millis timeout) override { return inner_->get(prefix_ + key, timeout); }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(prefix_ + key, delta); }
  bool check(const std::string& key) override { return inner_->check(prefix_ + key); }

  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    inner_->wait(full, timeout);
  }

 private:
  std::string prefix_;  // ends with '/'
  std::shared_ptr<Store> inner_;
};

}  // namespace

std::shared_ptr<Store> make_prefix_store(std::string prefix, std::shared_ptr<Store> inner) {
  if (!inner) throw StoreError("make_prefix_store(" + prefix + "): the inner store is null");
  return std::make_shared<PrefixStore>(std::move(prefix), std::move(inner));
}

}  // namespace mt
