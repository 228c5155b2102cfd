#!/usr/bin/env python3
"""No room includes a header of a room its library does not link (docs/ARCHITECTURE.md: "each library links only
the rooms below it"). The rooms and their links are read from CMakeLists.txt (mt_add_library(NAME FOLDER...) and
target_link_libraries(NAME ... mt_x ...)), so the linker's graph and this check cannot drift apart; the linker
itself only catches a missing link when a symbol is used, not a header-only include. Usage: layering.py SOURCE_DIR"""
import pathlib
import re
import sys

src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
cmake = (src / "CMakeLists.txt").read_text()
cmake = re.sub(r"#[^\n]*", "", cmake)
# Folder lists held in variables (set(VAR a b), list(APPEND VAR c): core/cuda joins mt_tensor only with CUDA).
variables = {}
for var, dirs in re.findall(r"set\((\w+)((?:\s+[\w/]+)+)\)", cmake):
    variables.setdefault(var, []).extend(dirs.split())
for var, dirs in re.findall(r"list\(APPEND\s+(\w+)((?:\s+[\w/]+)+)\)", cmake):
    variables.setdefault(var, []).extend(dirs.split())
folders = {}  # library -> its folders
for name, args in re.findall(r"mt_add_library\((mt_\w+)([^)]*)\)", cmake):
    dirs = []
    for arg in args.split():
        ref = re.fullmatch(r"\$\{(\w+)\}", arg)
        dirs.extend(variables.get(ref.group(1), []) if ref else [arg])
    folders[name] = [d for d in dirs if "/" in d or (src / d).is_dir()]
links = {name: set() for name in folders}
for name, args in re.findall(r"target_link_libraries\((mt_\w+)([^)]*)\)", cmake):
    links.setdefault(name, set()).update(re.findall(r"\bmt_\w+\b", args))


def reach(lib, seen=None):
    seen = set() if seen is None else seen
    for dep in links.get(lib, ()):
        if dep not in seen:
            seen.add(dep)
            reach(dep, seen)
    return seen


room_of = {}  # folder -> library
for lib, dirs in folders.items():
    for d in dirs:
        room_of[d] = lib
if not room_of or "mt_tensor" not in folders or "core/cuda" not in folders["mt_tensor"]:
    sys.exit(f"layering.py: could not read the rooms from {src / 'CMakeLists.txt'} (found {folders})")

bad = []
checked = 0
for folder, lib in sorted(room_of.items()):
    allowed = {lib} | reach(lib)
    for f in sorted((src / folder).glob("*")):
        if f.suffix not in (".h", ".cpp", ".cu", ".cuh", ".inc"):
            continue
        checked += 1
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([\w/.]+)"', line)
            if not m:
                continue
            header_dir = str(pathlib.PurePosixPath(m.group(1)).parent)
            target = room_of.get(header_dir)
            if target is None or target in allowed:
                continue
            bad.append(f"{f.relative_to(src)}:{n}: includes {m.group(1)} ({target}), which {lib} does not link")
print(f"{checked} files of {len(room_of)} folders checked against the links of CMakeLists.txt")
if bad:
    print("\n".join(bad))
    print("a room may include only the rooms its library links (docs/ARCHITECTURE.md); move the code or add the link")
    sys.exit(1)
