#include "parallel/comm/gloo_store_adapter.h"

#include <utility>

namespace mt {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<mt::Store> store, std::string prefix, Millis timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(prefix_ + key, Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  Bytes value = store_->get(prefix_ + key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& k : keys) prefixed.push_back(prefix_ + k);
  store_->wait(prefixed, timeout);
}

}  // namespace mt
