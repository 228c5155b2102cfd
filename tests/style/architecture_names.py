#!/usr/bin/env python3
"""docs/ARCHITECTURE.md names every source file: each .cpp, .h, .cu, .cuh and .inc under app/, core/, models/,
parallel/ and plan/ is named there by its stem (`gemm` for gemm.cpp and gemm.h, `attention.cu`'s `attention`), so
a file added without a word in the house's drawing fails here. Usage: architecture_names.py SOURCE_DIR"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
doc = (root / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
# The words of the page: identifiers and file names, as a reader searches them.
words = set(re.findall(r"[A-Za-z0-9_]+", doc))
missing = []
for room in ("app", "core", "models", "parallel", "plan"):
    for f in sorted((root / room).rglob("*")):
        if f.suffix not in (".cpp", ".h", ".cu", ".cuh", ".inc"):
            continue
        stem = f.name.split(".")[0]
        if stem not in words:
            missing.append(str(f.relative_to(root)))
if missing:
    print("docs/ARCHITECTURE.md names none of these source files (say in its room what each is for):")
    for m in missing:
        print("  " + m)
    sys.exit(1)
print("docs/ARCHITECTURE.md names every source file")
