#!/usr/bin/env python3
"""composition.py: the pairwise composition matrix of issue 45, generated, not hand-listed.

The features below are what a user turns on; each maps to the config keys that turn it on. Two features are a
meaningful pair unless they are alternatives of one choice (two pipeline schedules, two ZeRO stages, two recompute
kinds, two precisions) or a pair in REFUSED (a combination with no meaning, refused by the config with the reason
given there). A covering set of runs is drawn greedily and deterministically: each run turns on several features,
every meaningful pair is on together in at least one run, and no run needs more than MAX_WORLD ranks.

  composition.py runs       one JSON object a line: name, world, features, sets (the --set arguments), reference
                            (the one-rank run of the same model, precision, data and recompute features), tolerance
  composition.py pairs      every meaningful pair and the run that covers it
  composition.py markdown   docs/parallelism.md's composition table (tests/e2e/composition_matrix.sh checks the two
                            agree)
"""
import itertools
import json
import sys

# name: (--set arguments, ranks it multiplies the layout by along its dimension)
FEATURES = {
    "TP+SP": ["parallel.tensor=2", "parallel.sequence_parallel=true"],
    "CP": ["parallel.context=2"],
    "PP 1F1B": ["parallel.pipeline=2", "parallel.pipeline_schedule=1f1b"],
    "interleaved": ["parallel.pipeline=2", "parallel.virtual_pipeline=2", "parallel.pipeline_schedule=interleaved"],
    "ZB-H1": ["parallel.pipeline=2", "parallel.pipeline_schedule=zb-h1"],
    "ZB-V": ["parallel.pipeline=2", "parallel.virtual_pipeline=2", "parallel.pipeline_schedule=zb-v"],
    "DP": ["parallel.data=2"],
    "ZeRO-1": ["parallel.shard=optimizer"],
    "ZeRO-2": ["parallel.shard=gradients"],
    "ZeRO-3": ["parallel.shard=parameters"],
    "HSDP": ["parallel.shard_group=1"],
    "offload": ["optimizer.offload=true"],
    "EP": ["parallel.expert=2"],
    "MoE": ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.ffn_hidden_size=64",
            "model.moe.shared_expert_ffn_hidden_size=64", "model.moe.aux_loss_coeff=0.01"],
    "fp8": ["training.fp8.format=hybrid"],
    "LoRA": ["finetune.lora.rank=4", "finetune.lora.random_base=true"],
    "SFT packing": ["data.train=[sft]", "data.sft_packing=pack"],
    "full recompute": ["training.recompute=full"],
    # Megatron's uniform method in groups of 3: 3 + 1 over the 4 layers of one rank, a whole chunk under PP.
    "uniform recompute": ["training.recompute=full", "training.recompute_method=uniform",
                          "training.recompute_num_layers=3"],
    "selective recompute": ["training.recompute=selective"],
    "bf16": ["training.precision=bf16"],
    "fp16": ["training.precision=fp16"],
}
ORDER = list(FEATURES)
# Each turns on one dimension of the rank grid (the others are 1).
RANKS = {"TP+SP": "tp", "CP": "cp", "PP 1F1B": "pp", "interleaved": "pp", "ZB-H1": "pp", "ZB-V": "pp", "DP": "dp"}
# The features that only lay the same model out over ranks: a run's reference drops them (one rank).
LAYOUT = {"TP+SP", "CP", "PP 1F1B", "interleaved", "ZB-H1", "ZB-V", "DP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "HSDP",
          "offload", "EP"}
# Alternatives of one choice: never on together (not a pair).
CHOICES = [
    ("the pipeline schedule", ["PP 1F1B", "interleaved", "ZB-H1", "ZB-V"]),
    ("the ZeRO stage (parallel.shard)", ["ZeRO-1", "ZeRO-2", "ZeRO-3"]),
    ("training.recompute", ["full recompute", "uniform recompute", "selective recompute"]),
    ("training.precision", ["bf16", "fp16"]),
]
# What a feature needs on beside it (added to every run that has it): the first of each list that is not on yet.
NEEDS = {
    "ZeRO-1": [["DP"]], "ZeRO-2": [["DP"]], "ZeRO-3": [["DP"]],
    "HSDP": [["DP"], ["ZeRO-1", "ZeRO-2", "ZeRO-3"]],
    "EP": [["MoE"], ["DP", "CP"]],
    "fp8": [["bf16"]],
}
# Pairs with no meaning, refused by the config: (a, b, the reason, a phrase of the config's error).
REFUSED = [
    ("fp8", "fp16", "fp8's GEMM outputs and everything else run in bf16", "needs training.precision: bf16"),
]
MAX_WORLD = 8


def choice_of(f):
    for name, members in CHOICES:
        if f in members:
            return name
    return None


def refused(a, b):
    for x, y, why, _ in REFUSED:
        if {a, b} == {x, y}:
            return why
    return None


def close(features):
    """The features with what they need added; None when that cannot be (a choice taken twice, a refused pair)."""
    on = set(features)
    changed = True
    while changed:
        changed = False
        for f in sorted(on, key=ORDER.index):
            for alternatives in NEEDS.get(f, []):
                if not on.intersection(alternatives):
                    on.add(alternatives[0])
                    changed = True
    for _, members in CHOICES:
        if len(on.intersection(members)) > 1:
            return None
    for a, b in itertools.combinations(sorted(on), 2):
        if refused(a, b):
            return None
    return on if world(on) <= MAX_WORLD else None


def world(on):
    dims = {RANKS[f] for f in on if f in RANKS}
    return 2 ** len(dims)


def meaningful_pairs():
    out = []
    for a, b in itertools.combinations(ORDER, 2):
        if choice_of(a) and choice_of(a) == choice_of(b):
            continue
        if close({a, b}) is None:
            continue
        out.append((a, b))
    return out


def covering_runs():
    """Greedy: each run starts from the first uncovered pair and takes on, in feature order, whatever covers the most
    uncovered pairs while the run stays possible; deterministic."""
    uncovered = set(meaningful_pairs())
    runs = []
    while uncovered:
        first = min(uncovered, key=lambda p: (ORDER.index(p[0]), ORDER.index(p[1])))
        on = close(set(first))
        while True:
            best, gain = None, 0
            for f in ORDER:
                if f in on:
                    continue
                trial = close(on | {f})
                if trial is None:
                    continue
                g = sum(1 for p in uncovered if set(p) <= trial) - sum(1 for p in uncovered if set(p) <= on)
                if g > gain:
                    best, gain = trial, g
            if best is None:
                break
            on = best
        covered = {p for p in uncovered if set(p) <= on}
        uncovered -= covered
        runs.append(sorted(on, key=ORDER.index))
    return runs


def slug(features):
    return "-".join(f.lower().replace("+", "").replace(" ", "").replace("-", "") for f in features)


def run_entries():
    entries = []
    for i, features in enumerate(covering_runs()):
        sets = [s for f in features for s in FEATURES[f]]
        model = [f for f in features if f not in LAYOUT]
        half = "bf16" in features or "fp16" in features
        entries.append({
            "name": f"run{i + 1:02d}",
            "world": world(set(features)),
            "features": features,
            "sets": sets,
            "reference": {"name": "one-" + (slug(model) or "fp32"), "sets": [s for f in model for s in FEATURES[f]]},
            "tolerance": 1e-2 if half else 1e-6,
        })
    return entries


def markdown():
    runs = run_entries()
    where = {}
    for r in runs:
        for p in itertools.combinations(r["features"], 2):
            where.setdefault(frozenset(p), r["name"])
    lines = ["| | " + " | ".join(ORDER) + " |", "|---|" + "---|" * len(ORDER)]
    for a in ORDER:
        cells = []
        for b in ORDER:
            if a == b:
                cells.append("")
            elif choice_of(a) and choice_of(a) == choice_of(b):
                cells.append("alt")
            elif refused(a, b):
                cells.append("no")
            else:
                cells.append(where.get(frozenset((a, b)), "?").replace("run", ""))
        lines.append(f"| **{a}** | " + " | ".join(cells) + " |")
    notes = [f"- `alt`: alternatives of {name} ({', '.join(members)}): one is chosen." for name, members in CHOICES]
    notes += [f"- `no`: {a} with {b}: {why}." for a, b, why, _ in REFUSED]
    notes.append(f"- A number: the run of `tests/e2e/composition_matrix.sh` that has both on ({len(runs)} runs cover "
                 f"{len(meaningful_pairs())} pairs):")
    notes += [f"  {r['name'][3:]}. {', '.join(r['features'])} ({r['world']} ranks)" for r in runs]
    return "\n".join(lines + [""] + notes)


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "runs"
    if what == "runs":
        for e in run_entries():
            print(json.dumps(e))
    elif what == "pairs":
        runs = run_entries()
        for a, b in meaningful_pairs():
            r = next(r["name"] for r in runs if a in r["features"] and b in r["features"])
            print(f"{a} x {b}: {r}")
    elif what == "refused":
        for a, b, why, phrase in REFUSED:
            on = close({a}) | close({b})
            print(json.dumps({"a": a, "b": b, "why": why, "phrase": phrase, "world": world(on),
                              "sets": [s for f in ORDER if f in on for s in FEATURES[f]]}))
    elif what == "markdown":
        print(markdown())
    else:
        sys.exit(f"composition.py: unknown command {what!r} (runs, pairs, refused, markdown)")


if __name__ == "__main__":
    main()
