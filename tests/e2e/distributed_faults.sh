#!/usr/bin/env bash
# Distributed failures end cleanly: an unreachable master ends the rank within parallel.timeout_s with a
# message naming the address; layouts this build cannot run are refused before any communication.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
port=$(free_port)
start=$(date +%s)
rc=0
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$MT" --config tiny.yaml --set parallel.timeout_s=2 >out.txt 2>err.txt || rc=$?
elapsed=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "unreachable master: exit $rc"
grep -q "127.0.0.1:$port" err.txt || { cat err.txt; fail "the error does not name the master address"; }
[ $elapsed -le 10 ] || fail "took ${elapsed}s to give up with a 2 s timeout"
echo "unreachable master: gave up after ${elapsed}s: $(cat err.txt)"
# Impossible layouts fail at once, naming the keys; no rank waits for another.
RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$MT" --config tiny.yaml --set parallel.tensor=2 >out.txt 2>err.txt && fail "world 3 with tensor 2 accepted"
grep -q "parallel" err.txt || fail "no key named: $(cat err.txt)"
echo "$(cat err.txt)"
# More stages than layers, and a TP size that does not divide the heads: refused by rank 0 alone, at once.
refuse() {  # world pattern overrides...
  local world=$1 pattern=$2; shift 2
  RANK=0 WORLD_SIZE=$world LOCAL_RANK=0 LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout -k 5 20 "$MT" --config tiny.yaml "$@" >out.txt 2>err.txt && fail "accepted: $*"
  grep -q "$pattern" err.txt || fail "no clear refusal for $*: $(cat err.txt)"
  echo "$(cat err.txt)"
}
refuse 4 "more than model.num_layers" --set parallel.pipeline=4
refuse 3 "does not divide model.num_heads" --set parallel.tensor=3
