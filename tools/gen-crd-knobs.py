"""Write the JobQueue CRD's worker-setting properties from the knob table, so a knob is declared once.

    python tools/gen-crd-knobs.py           # rewrite them in crds/ and copy the CRD into the chart
    python tools/gen-crd-knobs.py --check   # exit 1 when the committed CRD (or the chart's copy) differs

Each knob with a ``crd`` path (``worker/skiplock/knobs.py``: ``KNOBS`` and ``CRD_FIELDS``) is one property of
``spec`` (``backoff.*`` and ``retention.*`` inside those objects): its type, description, pattern, bounds, enum and
default come from the table. The rest of the CRD (operator fields, scaling, status, the cross-field rules) is
written by hand; this tool replaces only the knobs' property blocks, in place. Then run tools/gen-crd-docs.py.
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "worker"))

from skiplock.knobs import KNOBS, crd_node  # noqa: E402

CRD = ROOT / "crds" / "jobqueues.skiplock.io.yaml"
SPEC_INDENT = 16
"""Indentation of the properties of ``openAPIV3Schema.properties.spec`` in the CRD file."""


class Dumper(yaml.SafeDumper):
    """Block style; long descriptions folded (``>-``) at 100 columns, as the hand-written fields are."""


def _str(dumper: yaml.SafeDumper, value: str) -> Any:
    style = ">" if len(value) > 100 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _str)


def render(name: str, node: dict[str, Any], indent: int) -> list[str]:
    """The YAML lines of one property (``name:`` and its schema) at ``indent`` spaces."""
    text = yaml.dump({name: node}, Dumper=Dumper, sort_keys=False, width=100, default_flow_style=False)
    pad = " " * indent
    return [pad + line if line else line for line in text.rstrip("\n").split("\n")]


def block(lines: list[str], start: int, end: int, name: str, indent: int) -> tuple[int, int]:
    """The [first, past-last) lines of property ``name`` at ``indent`` within lines[start:end]."""
    key = " " * indent + name + ":"
    first = next((i for i in range(start, end) if lines[i] == key or lines[i].startswith(key + " ")), None)
    if first is None:
        raise SystemExit(f"gen-crd-knobs: {CRD.name} has no property {name!r} at indent {indent}")
    last = first + 1
    while last < end and (not lines[last].strip() or len(lines[last]) - len(lines[last].lstrip()) > indent):
        last += 1
    return first, last


def generate(text: str) -> str:
    lines = text.split("\n")
    spec_start, spec_end = block(lines, 0, len(lines), "spec", SPEC_INDENT - 4)  # openAPIV3Schema.properties.spec
    for k in KNOBS:
        if not k.crd:
            continue
        *parents, leaf = k.crd.split(".")
        start, end, indent = spec_start, spec_end, SPEC_INDENT
        for parent in parents:
            start, end = block(lines, start, end, parent, indent)
            indent += 4
        first, last = block(lines, start, end, leaf, indent)
        new = render(leaf, crd_node(k), indent)
        lines[first:last] = new
        spec_end += len(new) - (last - first)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift and exit 1, change nothing")
    args = parser.parse_args(argv)
    old = CRD.read_text()
    new = generate(old)
    if yaml.safe_load(new) is None:
        raise SystemExit("gen-crd-knobs: the generated CRD does not parse")
    if args.check:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(CRD), "generated"))
            print("gen-crd-knobs: crds/ is out of date: run python tools/gen-crd-knobs.py", file=sys.stderr)
            return 1
        return subprocess.call(["bash", str(ROOT / "tools" / "sync-crds.sh"), "--check"])
    if new != old:
        CRD.write_text(new)
        print(f"wrote {CRD.relative_to(ROOT)}")
    return subprocess.call(["bash", str(ROOT / "tools" / "sync-crds.sh")])


if __name__ == "__main__":
    raise SystemExit(main())
