#!/usr/bin/env bash
# No path of the build machine is compiled into a binary: the GPU bundle (scripts/gpu-bundle.sh) runs the binaries
# from wherever it is copied, where the build machine's source and build folders do not exist. A CMake file that
# hands CMAKE_SOURCE_DIR, CMAKE_BINARY_DIR, a *_SOURCE_DIR / *_BINARY_DIR or a $<TARGET_FILE:...> to the compiler
# fails here; tests find their data at run time instead (tests/unit/source_root.h). Usage: no_build_paths.sh SOURCE_DIR
set -uo pipefail
src=${1:?usage: no_build_paths.sh SOURCE_DIR}
cd "$src" || exit 1
mapfile -t files < <(find . -path ./build -prune -o -path './build-*' -prune -o -path ./.deps -prune -o \
                          \( -name CMakeLists.txt -o -name '*.cmake' \) -print | sort)
bad=0
for f in "${files[@]}"; do
  # Each compile-definition / compile-option command, joined onto one line up to its closing parenthesis.
  while IFS= read -r cmd; do
    if grep -Eq '(CMAKE_(CURRENT_)?(SOURCE|BINARY)_DIR|PROJECT_(SOURCE|BINARY)_DIR|_SOURCE_DIR\}|_BINARY_DIR\}|TARGET_FILE)' <<<"$cmd"; then
      echo "$f: a build-machine path is compiled in: $cmd"
      bad=1
    fi
  done < <(awk '/(target_compile_definitions|add_compile_definitions|add_definitions|target_compile_options|add_compile_options)[[:space:]]*\(/ {c = ""; on = 1}
                on {c = c " " $0; if ($0 ~ /\)/) {print c; on = 0}}' "$f")
done
[[ $bad == 0 ]] || { echo "find such files at run time instead (see tests/unit/source_root.h)"; exit 1; }
echo "${#files[@]} CMake files compile in no build-machine path"
