#!/usr/bin/env python3
"""No room includes a header of a room its library may not link (docs/ARCHITECTURE.md: "each library links only
the rooms below it"). The intended graph is written here, fixed, rather than read back from CMakeLists.txt: a link
added to CMakeLists.txt to make an include build does not make it allowed; changing the design is changing this
list. The linker itself only catches a missing link when a symbol is used, not a header-only include, so every
#include of every room is checked against the list. Usage: layering.py SOURCE_DIR"""
import pathlib
import re
import sys

# library: (its rooms, the libraries it links directly); a library may include what its links reach, transitively.
LIBRARIES = {
    "mt_base": (["core/base"], []),
    "mt_io": (["core/io"], []),
    "mt_tensor": (["core/tensor", "core/cpu", "core/cuda", "core/meta"], ["mt_base"]),
    "mt_optim": (["core/optim"], ["mt_tensor"]),
    "mt_config": (["core/config"], ["mt_optim", "mt_base"]),
    "mt_tokenizer": (["core/tokenizer"], ["mt_io", "mt_base"]),
    "mt_data": (["core/data"], ["mt_tokenizer", "mt_io", "mt_base"]),
    "mt_checkpoint": (["core/checkpoint"], ["mt_tensor", "mt_io"]),
    "mt_hf": (["core/hf"], ["mt_checkpoint", "mt_data"]),
    "mt_store": (["parallel/store"], ["mt_base"]),
    "mt_comm": (["parallel/comm"], ["mt_store", "mt_tensor"]),
    "mt_pipeline": (["parallel/pipeline"], ["mt_comm"]),
    "mt_layers": (["parallel/layers"], ["mt_pipeline", "mt_comm"]),
    "mt_sharding": (["parallel/sharding"], ["mt_comm", "mt_optim"]),
    "mt_parallel": ([], ["mt_store", "mt_comm", "mt_pipeline", "mt_layers", "mt_sharding"]),  # parallel/'s rooms
    "mt_models": (["models"], ["mt_parallel", "mt_config"]),
    "mt_plan": (["plan"], ["mt_train", "mt_models", "mt_io"]),
    "mt_runtime": (["app/runtime"], ["mt_parallel", "mt_config", "mt_io"]),
    "mt_train": (["app/train"],
                 ["mt_runtime", "mt_models", "mt_hf", "mt_checkpoint", "mt_data", "mt_io", "mt_optim"]),
    "mt_cli": (["app/cli"], ["mt_train", "mt_plan"]),  # with megatrain's main.cpp
}
# Rooms of one library that may not see each other whole: the tensor's dispatch reaches the backends only through
# their registered tables (core/tensor/backend.h), so core/tensor includes neither backend; each backend includes
# the tensor and never the other backend. room: the rooms of its own library it may include.
ROOM_LINKS = {
    "core/tensor": [],
    "core/cpu": ["core/tensor"],
    "core/cuda": ["core/tensor"],
    "core/meta": ["core/tensor"],
}
# Folders that hold C++ sources; every one of them must be a room of LIBRARIES.
TREES = ["app", "core", "parallel", "models", "plan"]
SOURCES = (".h", ".cpp", ".cu", ".cuh", ".inc")

src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")


def reach(lib, seen=None):
    seen = set() if seen is None else seen
    for dep in LIBRARIES[lib][1]:
        if dep not in seen:
            seen.add(dep)
            reach(dep, seen)
    return seen


room_of = {room: lib for lib, (rooms, _) in LIBRARIES.items() for room in rooms}

bad = []
for tree in TREES:
    for f in sorted((src / tree).rglob("*")):
        if f.suffix in SOURCES and str(f.parent.relative_to(src)) not in room_of:
            bad.append(f"{f.relative_to(src)}: its folder is no room of the graph in {pathlib.Path(__file__).name}")

checked = 0
for room, lib in sorted(room_of.items()):
    allowed_libs = reach(lib)
    allowed_rooms = {room, *ROOM_LINKS.get(room, LIBRARIES[lib][0])}
    for f in sorted((src / room).glob("*")):
        if f.suffix not in SOURCES:
            continue
        checked += 1
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([\w/.]+)"', line)
            if not m:
                continue
            header_room = str(pathlib.PurePosixPath(m.group(1)).parent)
            target = room_of.get(header_room)
            if target is None or target in allowed_libs or header_room in allowed_rooms:
                continue
            if target == lib:
                bad.append(f"{f.relative_to(src)}:{n}: includes {m.group(1)}: {room} may include only "
                           f"{sorted(allowed_rooms)} of {lib}")
            else:
                bad.append(f"{f.relative_to(src)}:{n}: includes {m.group(1)} ({target}), which {lib} does not link")
print(f"{checked} files of {len(room_of)} rooms checked against the library graph of {pathlib.Path(__file__).name}")
if bad:
    print("\n".join(bad))
    print("a room may include only the rooms its library links (docs/ARCHITECTURE.md); move the code, or change the "
          "design and this graph with it")
    sys.exit(1)
