#!/usr/bin/env python3
"""attention_calls.py METRICS_JSONL cudnn|kernel: checks which attention a GPU run took.

The trainer logs cumulative counts on every iteration record of RUN_DIR/metrics.jsonl ("attention_cudnn_calls",
"attention_kernel_calls", "attention_cpu_calls": calls since the run started, forward and backward). The last
training record (one with ms_per_iter: validation and event records carry no counts) must show only the expected
path: cudnn means attention_cudnn_calls > 0 and
attention_kernel_calls == 0 (no fallback to megatrain's kernel), kernel the other way round. Prints one line and
exits 0, or names the file, the counts and what was expected on stderr and exits 1. Used by
tests/e2e/gpu_train_matches_cpu.sh and bench/gpu_throughput.sh.
"""
import json
import sys


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("cudnn", "kernel"):
        sys.exit("usage: attention_calls.py METRICS_JSONL cudnn|kernel")
    path, want = sys.argv[1], sys.argv[2]
    try:
        rows = [json.loads(line) for line in open(path) if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"attention_calls: cannot read {path}: {e}")
    rows = [r for r in rows if "iteration" in r and "ms_per_iter" in r]
    if not rows:
        sys.exit(f"attention_calls: {path} holds no training iteration record")
    last = rows[-1]
    keys = ("attention_cudnn_calls", "attention_kernel_calls")
    missing = [k for k in keys if k not in last]
    if missing:
        sys.exit(f"attention_calls: {path}: iteration {last['iteration']} carries no {' / '.join(missing)} (the "
                 f"trainer must log the cumulative attention call counts to show that {want} attention ran)")
    cudnn, kernel = last["attention_cudnn_calls"], last["attention_kernel_calls"]
    used, other = (cudnn, kernel) if want == "cudnn" else (kernel, cudnn)
    if not used > 0 or other != 0:
        sys.exit(f"attention_calls: {path}: {want} attention was expected, but after iteration {last['iteration']} "
                 f"attention_cudnn_calls = {cudnn}, attention_kernel_calls = {kernel}")
    print(f"{path}: {want} attention only ({cudnn} cuDNN calls, {kernel} kernel calls by iteration "
          f"{last['iteration']})")


if __name__ == "__main__":
    main()
