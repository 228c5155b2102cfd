// comm_gloo_rendezvous.cpp: make_gloo_communicator: a group's Gloo rendezvous over the store (TCP pairs between all
// members), its shared-memory rounds when every member is on this host, and the handler that turns a failure in
// Gloo's transport thread into an error exit.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <spdlog/spdlog.h>

#include "parallel/comm/comm_gloo_detail.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/gloo_store_adapter.h"
#include "parallel/comm/group.h"

namespace mt {
namespace {

using gloo_detail::GroupInfo;
using gloo_detail::mentions_timeout;
using gloo_detail::seconds_str;

// Gloo's TCP transport runs a background thread that throws (gloo::EnforceNotMet, gloo::IoException) when a
// peer breaks the protocol, e.g. sends a message larger than the one this rank posted: nothing of ours can
// catch that, and the process would abort with a core dump. This terminate handler turns it into an error
// exit naming what failed and the likely cause; other terminations go on to the previous handler.
std::terminate_handler g_previous_terminate = nullptr;

[[noreturn]] void on_terminate() {
  if (std::exception_ptr ep = std::current_exception()) {
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      if (what.find("gloo") != std::string::npos) {
        std::fflush(stdout);
        std::fprintf(stderr,
                     "megatrain: error: the Gloo transport failed in its background thread: %s (a peer sent data "
                     "this rank did not expect: do all ranks run the same binary and config?)\n",
                     what.c_str());
        std::fflush(stderr);
        std::_Exit(1);
      }
    } catch (...) {
    }
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

void install_terminate_handler() {
  static std::once_flag once;
  std::call_once(once, [] { g_previous_terminate = std::set_terminate(on_terminate); });
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Store> store, const GlooOptions& opt) {
  install_terminate_handler();
  auto group = std::make_shared<GroupInfo>();
  group->name = opt.name.empty() ? fmt::format("gloo[{}]", fmt::join(opt.members, ",")) : opt.name;
  group->members = opt.members;
  group->timeout = opt.timeout;
  const std::string& name = group->name;

  group->rank = rank_in_group(name, opt.members, opt.global_rank, opt.timeout, store.get());
  const int rank = group->rank;
  const int size = static_cast<int>(opt.members.size());

  const int64_t instance = group_instance(*store, "gloo", name, opt.global_rank);
  GlooStoreAdapter adapter(store, fmt::format("gloo/{}/{}/", name, instance), opt.timeout);

  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = opt.hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("{}: cannot open a Gloo TCP device on '{}' on {}: {}", name, opt.hostname,
                                group->who(rank), e.what()));
  }

  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(opt.timeout);  // also bounds connectFullMesh's store waits and connects
  try {
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    // connectFullMesh publishes each rank's addresses under the key "<rank>": name the ranks that never did.
    std::vector<int> missing, missing_global;
    try {
      for (int r = 0; r < size; ++r)
        if (r != rank && !store->check(adapter.prefix() + std::to_string(r))) {
          missing.push_back(r);
          missing_global.push_back(opt.members[r]);
        }
    } catch (const std::exception&) {
      missing.clear();  // the store itself is gone; its error is in e already
    }
    // Our store reports its waits running out as StoreError.
    bool timed_out = dynamic_cast<const StoreError*>(&e) != nullptr || mentions_timeout(e.what());
    std::string who_missing = missing.empty() ? ""
                                              : fmt::format(" rank(s) [{}] (global [{}]) never joined;",
                                                            fmt::join(missing, ", "), fmt::join(missing_global, ", "));
    throw CommError(fmt::format("{}: rendezvous {} on {}:{} {}", name,
                                timed_out ? "timed out after " + seconds_str(opt.timeout) : std::string("failed"),
                                group->who(rank), who_missing, e.what()));
  }
  try {
    std::string why_not;
    group->shm = SharedRounds::join(*store, adapter.prefix() + "shm/", rank, opt.members, opt.shared_memory,
                                    opt.timeout, &why_not);
    if (!group->shm && size > 1) spdlog::debug("{}: collectives over Gloo's TCP only: {}", name, why_not);
  } catch (const std::exception& e) {
    throw CommError(
        fmt::format("{}: rendezvous of the shared-memory segment failed on {}: {}", name, group->who(rank), e.what()));
  }
  return gloo_detail::make_communicator(std::move(group), std::move(context));
}

}  // namespace mt
