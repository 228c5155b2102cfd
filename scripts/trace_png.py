#!/usr/bin/env python3
"""A picture of one traced iteration of megatrain's timeline (RUN_DIR/trace.json): a row per rank, forwards blue,
backwards (B, or a whole backward) green, weight gradients (W) orange, waits grey, the rest (optimizer, reductions)
purple; time runs left to right over the iteration. Standard library only (zlib PNG writer).

Usage: trace_png.py TRACE.json OUT.png [ITERATION] [WIDTH]"""
import json
import struct
import sys
import zlib

COLOURS = {"F": (66, 133, 244), "B": (52, 168, 83), "W": (251, 140, 0), "wait": (200, 200, 200),
           "other": (142, 68, 173)}
ROW, GAP, MARGIN = 28, 6, 4


def png(width, height, pixels):
    raw = b"".join(b"\x00" + bytes(pixels[y * width * 3:(y + 1) * width * 3]) for y in range(height))

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    events = json.load(open(sys.argv[1]))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    iterations = sorted({int(e["name"].split()[-1]) for e in spans if e["cat"] == "iteration"})
    it = int(sys.argv[3]) if len(sys.argv) > 3 else iterations[-1]
    width = int(sys.argv[4]) if len(sys.argv) > 4 else 1600
    windows = {e["pid"]: (e["ts"], e["ts"] + e["dur"]) for e in spans
               if e["cat"] == "iteration" and e["name"] == f"iteration {it}"}
    start, end = min(w[0] for w in windows.values()), max(w[1] for w in windows.values())
    ranks = sorted(windows)
    height = 2 * MARGIN + len(ranks) * (ROW + GAP)
    pixels = bytearray([255] * (width * height * 3))
    scale = (width - 2 * MARGIN) / (end - start)

    def kind(e):
        if e["cat"] == "compute":
            return e["name"].split()[0]
        if e["cat"] == "wait":
            return "wait"
        return None if e["cat"] in ("iteration", "p2p") else "other"

    for row, pid in enumerate(ranks):
        lo, hi = windows[pid]
        for e in sorted((e for e in spans if e["pid"] == pid and e["tid"] == 0 and lo <= e["ts"] <= hi),
                        key=lambda e: e["cat"] != "wait"):  # waits first, compute drawn over them
            k = kind(e)
            if k is None:
                continue
            colour = COLOURS.get(k, COLOURS["other"])
            x0 = MARGIN + int((e["ts"] - start) * scale)
            x1 = max(x0 + 1, MARGIN + int((e["ts"] + e["dur"] - start) * scale))
            y0 = MARGIN + row * (ROW + GAP)
            for y in range(y0, y0 + ROW):
                for x in range(x0, min(x1, width - MARGIN)):
                    i = (y * width + x) * 3
                    pixels[i:i + 3] = bytes(colour)
            if k in "FBW" and x1 - x0 > 2:  # a dark edge between neighbouring spans
                for y in range(y0, y0 + ROW):
                    i = (y * width + x0) * 3
                    pixels[i:i + 3] = bytes(c // 2 for c in colour)
    open(sys.argv[2], "wb").write(png(width, height, pixels))
    print(f"{sys.argv[2]}: iteration {it}, {len(ranks)} ranks, {(end - start) / 1e3:.1f} ms across {width} px")


if __name__ == "__main__":
    main()
