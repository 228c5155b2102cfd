#!/usr/bin/env python3
"""Where a traced iteration's time went, per rank, from megatrain's timeline (RUN_DIR/trace.json, logging.trace).

For each traced iteration the pipeline window runs from the first forward any rank starts to the last backward any
rank ends; a rank's busy time is the sum of its forward and backward spans (category "compute") inside it, and its
idle fraction 1 - busy / window: the pipeline bubble plus the waits on its neighbours. With equal forward and
backward costs 1F1B idles (p - 1) / (m + p - 1) of the window on every rank, interleaving over v chunks (p - 1) /
(v m + p - 1).

Usage: trace_summary.py TRACE.json [--json]   (prints a table, or one JSON object)"""
import json
import sys
from collections import defaultdict


def summarize(path):
    events = json.load(open(path))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    iterations = defaultdict(dict)  # iteration -> pid -> (start, end)
    for e in spans:
        if e["cat"] == "iteration":
            iterations[int(e["name"].split()[-1])][e["pid"]] = (e["ts"], e["ts"] + e["dur"])
    out = {"ranks": {str(p): n for p, n in sorted(names.items())}, "iterations": {}}
    for it, per_rank in sorted(iterations.items()):
        compute = defaultdict(list)
        for e in spans:
            lo, hi = per_rank.get(e["pid"], (None, None))
            if e["cat"] == "compute" and lo is not None and lo <= e["ts"] <= hi:
                compute[e["pid"]].append((e["ts"], e["ts"] + e["dur"]))
        if not compute:
            continue
        start = min(s for spans_ in compute.values() for s, _ in spans_)
        end = max(t for spans_ in compute.values() for _, t in spans_)
        window = end - start
        ranks = {}
        for pid in sorted(per_rank):
            busy = sum(t - s for s, t in compute.get(pid, []))
            lo, hi = per_rank[pid]
            ranks[str(pid)] = {
                "busy_ms": busy / 1e3,
                "idle_fraction": 1 - busy / window if window > 0 else 0.0,
                "iteration_ms": (hi - lo) / 1e3,
                "compute_spans": len(compute.get(pid, [])),
            }
        out["iterations"][str(it)] = {"pipeline_window_ms": window / 1e3, "ranks": ranks}
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    s = summarize(sys.argv[1])
    if "--json" in sys.argv[2:]:
        print(json.dumps(s, indent=1))
        return
    for it, v in s["iterations"].items():
        print(f"iteration {it}: pipeline window {v['pipeline_window_ms']:.2f} ms")
        for pid, r in v["ranks"].items():
            print(f"  {s['ranks'].get(pid, pid):<28} busy {r['busy_ms']:8.2f} ms  idle {100 * r['idle_fraction']:5.1f}%"
                  f"  iteration {r['iteration_ms']:8.2f} ms  ({r['compute_spans']} forwards and backwards)")


if __name__ == "__main__":
    main()
