#!/usr/bin/env bash
# Every tracked C++/CUDA source follows .clang-format. Usage: clang_format.sh SOURCE_DIR
# Different clang-format majors format differently, so the check runs with the one Debian 12 ships (14) and
# skips (77) with a message under another. To fix a failure: clang-format -i FILE...
set -uo pipefail
src=${1:?usage: clang_format.sh SOURCE_DIR}
cd "$src"
command -v clang-format >/dev/null || { echo "SKIP: clang-format is not installed"; exit 77; }
major=$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
[ "$major" = 14 ] || { echo "SKIP: clang-format $major here; the style is checked with clang-format 14"; exit 77; }
[ -d .git ] || git rev-parse --git-dir >/dev/null 2>&1 || { echo "SKIP: not a git checkout"; exit 77; }
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "not formatted as .clang-format says (run: clang-format -i ${bad[*]}):"
  for f in "${bad[@]}"; do echo "== $f"; clang-format "$f" | diff "$f" - | head -20; done
  exit 1
fi
echo "${#files[@]} files follow .clang-format"
