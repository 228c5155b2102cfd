#!/usr/bin/env bash
# logging.tensorboard writes TensorBoard event files under RUN_DIR/tensorboard: the records' framing and both
# masked CRC-32Cs check, and the scalars (loss, lr, grad norm, validation loss, ...) equal metrics.jsonl's at
# every logged iteration. Parsed here without TensorBoard (the interop test tensorboard_read.py reads them with
# its EventAccumulator when its venv is present). A resumed run adds a file, and its points continue the curve.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
"$MT" --config tiny.yaml --set training.train_iters=6 --set logging.interval=2 --set logging.eval_interval=3 \
      --set logging.eval_iters=1 --set logging.tensorboard=true --set logging.dir=run \
      --set checkpoint.save_dir=ckpt >/dev/null || fail "training with logging.tensorboard failed"
"$MT" --config tiny.yaml --set training.train_iters=8 --set logging.interval=2 --set logging.eval_interval=3 \
      --set logging.eval_iters=1 --set logging.tensorboard=true --set logging.dir=run \
      --set checkpoint.save_dir=ckpt >/dev/null || fail "resumed training failed"
python3 - run <<'PY' || fail "the event files do not match metrics.jsonl"
import glob, json, math, os, struct, sys

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def masked(c):
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF

def varint(b, i):
    v = s = 0
    while True:
        x = b[i]; i += 1
        v |= (x & 0x7F) << s; s += 7
        if x < 0x80:
            return v, i

def fields(b):  # protobuf wire format: (field, wire type, value)
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, t = key >> 3, key & 7
        if t == 0:
            v, i = varint(b, i)
        elif t == 1:
            v = b[i:i + 8]; i += 8
        elif t == 5:
            v = b[i:i + 4]; i += 4
        elif t == 2:
            n, i = varint(b, i); v = b[i:i + n]; i += n
        else:
            sys.exit(f"wire type {t}")
        yield f, t, v

run = sys.argv[1]
files = sorted(glob.glob(os.path.join(run, "tensorboard", "events.out.tfevents.*")))
if len(files) != 2:
    sys.exit(f"{len(files)} event files, expected 2 (one per run)")
points = {}  # tag -> {step: value}
for path in files:
    data = open(path, "rb").read()
    i = first = 0
    while i < len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        (lcrc,) = struct.unpack_from("<I", data, i + 8)
        body = data[i + 12:i + 12 + n]
        (dcrc,) = struct.unpack_from("<I", data, i + 12 + n)
        if lcrc != masked(crc32c(data[i:i + 8])) or dcrc != masked(crc32c(body)):
            sys.exit(f"{path}: bad CRC at byte {i}")
        i += 16 + n
        step, values, version = 0, [], None
        for f, t, v in fields(body):
            if f == 2: step = v
            if f == 3: version = v
            if f == 5:
                for vf, _, value in fields(v):
                    if vf == 1:
                        tag = simple = None
                        for ff, _, x in fields(value):
                            if ff == 1: tag = x.decode()
                            if ff == 2: (simple,) = struct.unpack("<f", x)
                        values.append((tag, simple))
        if first == 0 and version != b"brain.Event:2":
            sys.exit(f"{path}: first record is not the file version")
        first += 1
        for tag, simple in values:
            points.setdefault(tag, {})[step] = simple
records = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
checked = 0
for r in records:
    pairs = []
    if "loss" in r:
        pairs = [("lm loss", r["iteration"], r["loss"]), ("learning-rate", r["iteration"], r["lr"]),
                 ("grad-norm", r["iteration"], r["grad_norm"]),
                 ("lm loss vs samples", r["consumed_samples"], r["loss"]),
                 ("lm loss vs tokens", r["consumed_tokens"], r["loss"])]
    elif "valid_loss" in r:
        pairs = [("lm loss validation", r["iteration"], r["valid_loss"]),
                 ("lm loss validation ppl", r["iteration"], math.exp(r["valid_loss"]))]
    for tag, step, want in pairs:
        got = points.get(tag, {}).get(step)
        if got is None or abs(got - want) > 1e-6 * max(1.0, abs(want)):
            sys.exit(f"{tag} at step {step}: event file {got}, metrics.jsonl {want}")
        checked += 1
if sorted(points["lm loss"]) != [2, 4, 6, 8]:
    sys.exit(f"lm loss steps {sorted(points['lm loss'])}, expected 2, 4, 6, 8 across the resume")
for tag in ("memory/peak-total-MiB", "tokens-per-second", "loss-scale", "skipped-iterations", "nan-iterations"):
    if tag not in points:
        sys.exit(f"no {tag} curve")
print(f"{len(files)} event files, {len(points)} curves, {checked} points equal to metrics.jsonl")
PY
echo "PASS: TensorBoard event files match metrics.jsonl"
