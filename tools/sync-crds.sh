#!/usr/bin/env bash
# Copy the canonical CRDs of crds/ into the chart, byte for byte, as charts/skiplock/crds-src/.
#
# The chart renders them from templates/crds.yaml (behind crds.enabled, with the keep policy behind
# crds.keep), so they cannot live in the chart's crds/ folder, which Helm never templates.
# tests/chart/test_crds.py fails when the copies drift; run this script after every CRD change
# (tools/gen-crd-knobs.py, which writes the worker-setting properties from the knob table, runs it).
#   tools/sync-crds.sh          copy (and remove copies whose source is gone)
#   tools/sync-crds.sh --check  report drift and exit 1, change nothing
set -euo pipefail
shopt -s nullglob

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/crds"
DEST="$ROOT/charts/skiplock/crds-src"
check=0
[[ "${1:-}" == "--check" ]] && check=1

sources=("$SRC"/*.yaml)
(( ${#sources[@]} )) || { echo "sync-crds: no CRDs in $SRC" >&2; exit 1; }
mkdir -p "$DEST"
drift=0
for src in "${sources[@]}"; do
    dest="$DEST/$(basename "$src")"
    if ! cmp -s "$src" "$dest"; then
        drift=1
        if (( check )); then
            echo "sync-crds: ${dest#"$ROOT"/} differs from ${src#"$ROOT"/}" >&2
        else
            cp "$src" "$dest"
            echo "sync-crds: copied ${src#"$ROOT"/} -> ${dest#"$ROOT"/}"
        fi
    fi
done
for dest in "$DEST"/*.yaml; do
    if [[ ! -e "$SRC/$(basename "$dest")" ]]; then
        drift=1
        if (( check )); then
            echo "sync-crds: ${dest#"$ROOT"/} has no source in crds/" >&2
        else
            rm "$dest"
            echo "sync-crds: removed ${dest#"$ROOT"/}"
        fi
    fi
done
if (( check && drift )); then
    echo "sync-crds: run tools/sync-crds.sh" >&2
    exit 1
fi
exit 0
