#include "app/distributed.h"

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace mt::app {

namespace {

// The address other ranks reach this one's Gloo device at: loopback for single-node jobs started with a
// loopback master, else this host's name.
std::string gloo_hostname(const LaunchEnv& env) {
  if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost") return "127.0.0.1";
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  return name;
}

}  // namespace

std::unique_ptr<Distributed> init_distributed(const Config& cfg, const LaunchEnv& env) {
  const auto& p = cfg.parallel;
  if (p.tensor > 1 || p.pipeline > 1)
    throw std::invalid_argument(fmt::format(
        "{}: parallel.tensor={} parallel.pipeline={}: tensor and pipeline parallelism are not implemented yet "
        "(data parallelism is: keep tensor and pipeline at 1)",
        cfg.source, p.tensor, p.pipeline));
  auto d = std::make_unique<Distributed>();
  d->env = env;
  d->topology = Topology(env.world_size, static_cast<int>(p.tensor), static_cast<int>(p.pipeline),
                         static_cast<int>(p.data));
  if (env.world_size == 1) {
    d->store = make_hash_store();
    d->dp = make_gloo_communicator(d->store, GlooOptions{.name = "dp", .members = {0}, .global_rank = 0});
    return d;
  }
  const Millis timeout{static_cast<int64_t>(cfg.parallel.timeout_s * 1000)};
  if (env.rank == 0) d->server = std::make_unique<TcpStoreServer>("", env.master_port);
  d->store = connect_tcp_store(env.master_addr, env.master_port, timeout);
  const std::vector<int> dp_members = d->topology.dp_group(env.rank);
  d->dp = make_gloo_communicator(
      d->store, GlooOptions{.name = fmt::format("dp[{}]", fmt::join(dp_members, ",")),
                            .members = dp_members,
                            .global_rank = env.rank,
                            .hostname = gloo_hostname(env),
                            .timeout = timeout});
  spdlog::info("rank {} of {} ({}): tp {} dp {} pp {}, rendezvous at {}:{}", env.rank, env.world_size, env.launcher,
               d->topology.coord(env.rank).tp, d->topology.coord(env.rank).dp, d->topology.coord(env.rank).pp,
               env.master_addr, env.master_port);
  return d;
}

}  // namespace mt::app
