"""Reads a Megatron indexed dataset (PREFIX.bin/.idx) back as documents of ids, for the tokenizer interop checks.
Standard library only."""
import struct

DTYPES = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 6: "d", 7: "f", 8: "H"}


def read_indexed(prefix):
    """Documents of PREFIX.bin/.idx as lists of ids (Megatron's layout, see tests/data/write_indexed.py)."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "bad .idx magic"
    _version, code, nseq, ndoc = struct.unpack_from("<QBQQ", idx, 9)
    at = 9 + 25
    sizes = struct.unpack_from(f"<{nseq}i", idx, at)
    at += 4 * nseq
    pointers = struct.unpack_from(f"<{nseq}q", idx, at)
    at += 8 * nseq
    doc_idx = struct.unpack_from(f"<{ndoc}q", idx, at)
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    fmt = DTYPES[code]
    width = struct.calcsize(fmt)
    seqs = [list(struct.unpack_from(f"<{n}{fmt}", data, p)) for n, p in zip(sizes, pointers)]
    assert all(n * width >= 0 for n in sizes)
    return [sum(seqs[doc_idx[d]:doc_idx[d + 1]], []) for d in range(ndoc - 1)]


def read_tokens(prefix):
    """Every id of PREFIX.bin/.idx in file order, the documents concatenated (as `megatrain eval` reads samples)."""
    return [t for doc in read_indexed(prefix) for t in doc]
