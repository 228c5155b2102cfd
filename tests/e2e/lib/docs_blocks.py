#!/usr/bin/env python3
"""docs_blocks.py: the fenced code blocks of Markdown files, for tests/e2e/docs_examples.sh.

    python3 tests/e2e/lib/docs_blocks.py OUTDIR FILE.md...

Writes every ```bash block of each file, in order, to OUTDIR/NNN.sh (NNN counting across the files), and
OUTDIR/blocks.tsv with one line per block: NNN, the file, the line of its opening fence. Every opening fence
must name a language (```bash, ```yaml, ```text, ...): a bare ``` is an error naming the file and line, so that
whether a block runs is never a guess (the rule is simple: every ```bash block runs, nothing else does). An
unclosed fence is an error too. Exits 1 on an error, 0 otherwise.
"""
import os
import re
import sys

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")


def blocks(path):
    """(language, first line number of the fence, text) of every fenced block of the file."""
    out, errors = [], []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3)
        start = i + 1
        if not lang:
            errors.append(f"{path}:{start}: a fenced block without a language "
                          "(```bash runs; ```text, ```yaml, ... do not)")
        body = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            errors.append(f"{path}:{start}: the fence is never closed")
        out.append((lang, start, "\n".join(body) + "\n"))
        i += 1
    return out, errors


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    outdir, files = sys.argv[1], sys.argv[2:]
    os.makedirs(outdir, exist_ok=True)
    errors, n = [], 0
    with open(os.path.join(outdir, "blocks.tsv"), "w") as index:
        for path in files:
            found, errs = blocks(path)
            errors += errs
            for lang, line, text in found:
                if lang != "bash":
                    continue
                n += 1
                name = f"{n:03d}"
                with open(os.path.join(outdir, name + ".sh"), "w") as f:
                    f.write(text)
                index.write(f"{name}\t{path}\t{line}\n")
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
