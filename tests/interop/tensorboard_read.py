#!/usr/bin/env python3
"""Reads a directory of TensorBoard event files with the tensorboard package's EventAccumulator and prints
every scalar as "tag step value wall_time", sorted by tag then step (the interop check of core/io/tensorboard)."""
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})  # 0: keep every point
acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for e in acc.Scalars(tag):
        print(tag, e.step, repr(e.value), repr(e.wall_time))
