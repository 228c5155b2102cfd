#!/usr/bin/env python3
"""What ctest skipped, and why: reads ctest's JUnit file (ctest --output-junit) and prints a closing summary.

A skip is a GPU skip when its message says the machine has no usable GPU or the build has no CUDA backend (the
messages tests/unit/gpu_test.h, the CUDA unit tests and tests/e2e/lib/common.bash's require_gpu give). Every other
skip is listed with its message. Under CI (CI=true) every other skip fails the run: scripts/test.sh installs all
that the rest of the suite needs, so a test that skips there proves nothing and hides it.

The last line is the plain count "ctest: N passed, N failed, N skipped".

    tests/skip_report.py build/ctest-junit.xml
"""
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter

GPU_SKIP = re.compile(r"no usable GPU|no CUDA device|built without (the CUDA backend|cuDNN|NCCL)")


def skip_message(case):
    """The test's own words for why it skipped: an e2e test's SKIP line, or gtest's text before [  SKIPPED ]."""
    out = case.findtext("system-out") or ""
    for line in out.splitlines():
        if line.startswith("SKIP"):
            return line.strip()
    lines = out.splitlines()
    for i, line in enumerate(lines):  # gtest: "file.cpp:26: Skipped" then the streamed message
        if line.rstrip().endswith(": Skipped"):
            return " ".join(l.strip() for l in lines[i + 1:i + 3] if l.strip() and not l.startswith("["))
    skipped = case.find("skipped")
    return (skipped.get("message") if skipped is not None else None) or "(no message)"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
    except (OSError, ET.ParseError) as e:
        sys.exit(f"skip_report: cannot read ctest's JUnit file {sys.argv[1]}: {e}")
    passed = failed = 0
    gpu, other = Counter(), []
    for case in cases:
        status = case.get("status", "")
        if case.find("failure") is not None or status == "fail":
            failed += 1
        elif case.find("skipped") is not None or status in ("notrun", "disabled"):
            why = skip_message(case)
            if GPU_SKIP.search(why):
                gpu[re.sub(r"^SKIP: ", "", why)[:120]] += 1
            else:
                other.append((case.get("name"), why))
        else:
            passed += 1

    skipped = sum(gpu.values()) + len(other)
    print(f"skipped: {skipped} tests: {sum(gpu.values())} for want of a GPU, {len(other)} for another reason")
    for why, n in gpu.most_common():
        print(f"  GPU ({n}): {why}")
    for name, why in other:
        print(f"  NOT GPU: {name}: {why}")
    ci = os.environ.get("CI") == "true"
    if other and ci:
        print(f"skip_report: CI=true and {len(other)} tests skipped for a reason other than a missing GPU: "
              "each must run here (scripts/test.sh installs what they need)")
        failed, skipped = failed + len(other), sum(gpu.values())  # they count as failed
    print(f"ctest: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if other and ci else 0


if __name__ == "__main__":
    sys.exit(main())
