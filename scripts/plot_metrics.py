#!/usr/bin/env python3
"""plot_metrics.py: one PNG of training runs from their metrics.jsonl files.

    scripts/plot_metrics.py RUN_DIR_OR_METRICS_JSONL... -o out.png [--seq-length S] [--labels a,b]

Four panels against tokens consumed: training and validation loss, learning rate and throughput (tokens/s).
Tokens come from each record's `consumed_tokens` when the run wrote it, else consumed_samples * seq_length,
seq_length from --seq-length or the run's megatrain.log (the resolved config printed at start). Validation
records carry only an iteration; they are placed at the tokens of the training record of the same iteration
(or iteration * tokens per iteration). Needs matplotlib: run it with build/interop-venv/bin/python (the interop
environment scripts/python-env.sh makes).
"""
import argparse
import json
import os
import re
import sys


def metrics_path(arg):
    return os.path.join(arg, "metrics.jsonl") if os.path.isdir(arg) else arg


def seq_length_from_log(metrics):
    """model.seq_length from the resolved config that megatrain.log (beside metrics.jsonl) starts with."""
    log = os.path.join(os.path.dirname(os.path.abspath(metrics)), "megatrain.log")
    if not os.path.exists(log):
        return None
    in_model = False
    with open(log, errors="replace") as f:
        for line in f:
            if re.match(r"^model:\s*$", line):
                in_model = True
            elif in_model and re.match(r"^\S", line):
                in_model = False
            elif in_model:
                m = re.match(r"^\s+seq_length:\s*(\d+)\s*$", line)
                if m:
                    return int(m.group(1))
    return None


def load_run(path, seq_length):
    """(train rows, valid rows) with a "tokens" entry each; the last record of an iteration wins (a resumed
    run repeats the iterations after its checkpoint)."""
    train, valid = {}, {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics: {path}:{n}: not JSON: {e}")
            if "loss" in r:
                train[r["iteration"]] = r
            elif "valid_loss" in r:
                valid[r["iteration"]] = r
    if not train:
        sys.exit(f"plot_metrics: {path}: no training records (lines with \"loss\")")
    train = [train[i] for i in sorted(train)]
    valid = [valid[i] for i in sorted(valid)]
    needs_seq = any("consumed_tokens" not in r for r in train)
    if needs_seq and seq_length is None:
        seq_length = seq_length_from_log(path)
        if seq_length is None:
            sys.exit(f"plot_metrics: {path}: records lack consumed_tokens and no megatrain.log beside it names "
                     "model.seq_length; pass --seq-length")
    for r in train:
        r["tokens"] = r["consumed_tokens"] if "consumed_tokens" in r else r["consumed_samples"] * seq_length
    by_iter = {r["iteration"]: r["tokens"] for r in train}
    per_iter = train[-1]["tokens"] / train[-1]["iteration"]  # a constant global batch
    for r in valid:
        r["tokens"] = by_iter.get(r["iteration"], r["iteration"] * per_iter)
    return train, valid


def tokens_axis(ax):
    ax.set_xlabel("tokens")
    ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
    ax.grid(True, alpha=0.3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories (holding metrics.jsonl) or metrics.jsonl files")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--seq-length", type=int, help="model.seq_length, for runs without consumed_tokens")
    ap.add_argument("--labels", help="comma-separated legend labels, one per run (default: the run directories' names)")
    ap.add_argument("--title", default="", help="a title above the panels")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_metrics: needs matplotlib: run it with build/interop-venv/bin/python "
                 "(scripts/python-env.sh makes that environment)")
    # By default a run is named by its directory (a sweep's point: "optimizer.lr=1e-3_...").
    labels = (a.labels.split(",") if a.labels else
              [os.path.basename(os.path.dirname(os.path.abspath(metrics_path(r)))) for r in a.runs])
    if len(labels) != len(a.runs):
        sys.exit(f"plot_metrics: --labels has {len(labels)} names for {len(a.runs)} runs")

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (ax_loss, ax_valid), (ax_lr, ax_speed) = axes
    for run, label in zip(a.runs, labels):
        path = metrics_path(run)
        if not os.path.exists(path):
            sys.exit(f"plot_metrics: {path}: no such file")
        train, valid = load_run(path, a.seq_length)
        x = [r["tokens"] for r in train]
        line, = ax_loss.plot(x, [r["loss"] for r in train], label=label, linewidth=1.2)
        color = line.get_color()
        if valid:
            ax_valid.plot([r["tokens"] for r in valid], [r["valid_loss"] for r in valid], "o-", color=color,
                          label=label, markersize=3)
        ax_lr.plot(x, [r["lr"] for r in train], color=color, label=label)
        ax_speed.plot(x, [r["tokens_per_s"] for r in train], color=color, label=label)
    ax_loss.set_title("training loss")
    ax_loss.set_ylabel("loss")
    ax_valid.set_title("validation loss")
    ax_valid.set_ylabel("loss")
    if not ax_valid.lines:
        ax_valid.text(0.5, 0.5, "no validation records\n(logging.eval_interval: 0)", ha="center", va="center",
                      transform=ax_valid.transAxes, color="gray")
    ax_lr.set_title("learning rate")
    ax_lr.set_ylabel("lr")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    ax_speed.set_title("throughput")
    ax_speed.set_ylabel("tokens/s")
    ax_speed.set_ylim(bottom=0)
    for ax in axes.flat:
        tokens_axis(ax)
    ax_loss.legend(fontsize=8)
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.output, dpi=100)
    print(f"plot_metrics: wrote {a.output} ({len(a.runs)} run{'s' if len(a.runs) != 1 else ''})")


if __name__ == "__main__":
    main()
