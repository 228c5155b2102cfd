// config_rules.h: the rules a read Config must satisfy, and its derived values.
#pragma once
#include <cstdint>

#include "core/config/config.h"
#include "core/config/config_source.h"

namespace mt {

// Fills defaults that depend on other keys (ffn_hidden_size, max_position_embeddings, parallel.data, global
// batch, decay_iters) and the derived values, checking every rule on the way against `world_size`.
// Throws ConfigError naming the key path (located through `src`) and the rule.
void resolve_config(Config& c, int64_t world_size, const ConfigSource& src);

}  // namespace mt
