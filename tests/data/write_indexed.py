#!/usr/bin/env python3
"""write_indexed.py OUTDIR: writes Megatron indexed datasets straight from the format spec, for tests.

An independent writer (pure `struct`, no numpy, no megatrain code): for every dtype code 1..8 it writes
OUTDIR/code<K>.bin, OUTDIR/code<K>.idx and OUTDIR/code<K>.expected, the last listing the tokens in plain
text so that a reader can be checked token for token:

    doc                  a document starts
    seq N t1 ... tN      one sequence of that document (N may be 0)

.idx layout (little-endian, no padding): b"MMIDIDX\\x00\\x00", u64 version 1, u8 dtype code, u64 sequence
count N, u64 document-index entry count (documents + 1, as Megatron's _IndexWriter writes
len(document_indices)), i32[N] lengths, i64[N] byte pointers, i64[documents + 1] document index
(0, ..., N).
"""
import os
import struct
import sys

# code: (struct format, item size, smallest token, largest token)
DTYPES = {
    1: ("B", 1, 0, 255),
    2: ("b", 1, -128, 127),
    3: ("h", 2, -32768, 32767),
    4: ("i", 4, -2**31, 2**31 - 1),
    5: ("q", 8, -2**31, 2**31 - 1),  # int64 storage, values an int32 reader accepts
    6: ("d", 8, -2**31, 2**31 - 1),  # float64: integral values, exact
    7: ("f", 4, -2**24, 2**24),      # float32: integral values, exact up to 2^24
    8: ("H", 2, 0, 65535),
}


def tokens(rng_state, count, lo, hi):
    """count pseudo-random ints in [lo, hi] from a 64-bit LCG, with the range ends mixed in."""
    out = []
    for i in range(count):
        rng_state[0] = (rng_state[0] * 6364136223846793005 + 1442695040888963407) % 2**64
        if i % 7 == 3:
            out.append(lo)
        elif i % 7 == 5:
            out.append(hi)
        else:
            out.append(lo + (rng_state[0] >> 11) % (hi - lo + 1))
    return out


def documents(code, lo, hi):
    """Documents as lists of sequences: single- and multi-sequence documents, an empty sequence and an
    empty document (two equal document-index entries)."""
    rng = [code * 1000003]
    shapes = [[5], [3, 0, 4], [], [1], [9, 2], [17, 1, 1, 6]]
    return [[tokens(rng, n, lo, hi) for n in shape] for shape in shapes]


def write(prefix, code, docs):
    fmt, size, _, _ = DTYPES[code]
    lengths, pointers, doc_index = [], [], [0]
    with open(prefix + ".bin", "wb") as bin_file:
        offset = 0
        for doc in docs:
            for seq in doc:
                bin_file.write(struct.pack("<%d%s" % (len(seq), fmt), *seq))
                lengths.append(len(seq))
                pointers.append(offset)
                offset += len(seq) * size
            doc_index.append(len(lengths))
    with open(prefix + ".idx", "wb") as idx:
        idx.write(b"MMIDIDX\x00\x00")
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", code))
        idx.write(struct.pack("<Q", len(lengths)))
        idx.write(struct.pack("<Q", len(doc_index)))
        idx.write(struct.pack("<%di" % len(lengths), *lengths))
        idx.write(struct.pack("<%dq" % len(pointers), *pointers))
        idx.write(struct.pack("<%dq" % len(doc_index), *doc_index))
    with open(prefix + ".expected", "w") as exp:
        for doc in docs:
            exp.write("doc\n")
            for seq in doc:
                exp.write(" ".join(["seq", str(len(seq))] + [str(t) for t in seq]) + "\n")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: write_indexed.py OUTDIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for code, (_, _, lo, hi) in DTYPES.items():
        write(os.path.join(out, "code%d" % code), code, documents(code, lo, hi))


if __name__ == "__main__":
    main()
