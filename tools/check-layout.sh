#!/usr/bin/env bash
# Guard: a .py file directly in operator/ would make `import operator` resolve to our folder.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob
bad=(operator/*.py)
if ((${#bad[@]})); then
  echo "error: no Python files directly in operator/ (they shadow the stdlib 'operator'): ${bad[*]}" >&2
  exit 1
fi
