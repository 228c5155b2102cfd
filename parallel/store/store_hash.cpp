// store_hash.cpp: the in-process store (threads as ranks): a map under a mutex; get and wait block on a
// condition variable until the keys appear or the timeout passes.
#include <condition_variable>
#include <map>
#include <mutex>

#include "parallel/store/store.h"
#include "parallel/store/store_detail.h"

namespace mt {
namespace {

using store_detail::Clock;

class HashStore final : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override {
    {
      std::lock_guard lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }

  Bytes get(const std::string& key, Millis timeout) override {
    auto start = Clock::now();
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, store_detail::deadline_after(timeout), [&] { return data_.count(key) > 0; })) {
      throw StoreError("in-process store: get(" + key + ") timed out after " +
                       store_detail::format_seconds(Clock::now() - start));
    }
    return data_.at(key);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t value = delta;
    {
      std::lock_guard lock(mu_);
      auto it = data_.find(key);
      if (it != data_.end()) {
        auto old = store_detail::parse_counter(it->second);
        if (!old) throw StoreError("in-process store: add(" + key + ") on a value that is not an integer");
        value = *old + delta;
      }
      data_[key] = store_detail::format_counter(value);
    }
    cv_.notify_all();
    return value;
  }

  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    auto start = Clock::now();
    std::unique_lock lock(mu_);
    auto all_present = [&] {
      for (const auto& k : keys)
        if (!data_.count(k)) return false;
      return true;
    };
    if (!cv_.wait_until(lock, store_detail::deadline_after(timeout), all_present)) {
      std::vector<std::string> missing;
      for (const auto& k : keys)
        if (!data_.count(k)) missing.push_back(k);
      throw StoreError("in-process store: wait for " + std::to_string(keys.size()) + " keys timed out after " +
                       store_detail::format_seconds(Clock::now() - start) +
                       "; missing keys: " + store_detail::join_keys(missing));
    }
  }

  bool check(const std::string& key) override {
    std::lock_guard lock(mu_);
    return data_.count(key) > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
};

}  // namespace

std::shared_ptr<Store> make_hash_store() { return std::make_shared<HashStore>(); }

}  // namespace mt
