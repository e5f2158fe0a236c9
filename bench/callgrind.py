"""What the bench scripts that count a client's instructions under callgrind share: the check that valgrind is
installed, the command that runs a process under it with counting off, switching counting on and off in that
process, the count valgrind prints at its exit, the variants to count (the working tree, and a commit's worker/)
and the medians they print."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

COLLECTED = re.compile(r"Collected : (\d+)")
MISSING = "valgrind not found (apt-get install valgrind)"


def installed() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


def command(out: Path | str = "/dev/null") -> list[str]:
    """The prefix that runs a process under callgrind, counting off until :func:`counting` turns it on."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]


def counting(pid: int, on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)], check=True, capture_output=True)


def collected(output: str) -> int | None:
    """The instructions valgrind counted, from what it printed at the process's exit (None: it printed none)."""
    found = COLLECTED.findall(output)
    return int(found[-1]) if found else None


def variants(ref: str | None) -> list[tuple[str, str | None]]:
    """``("tree", None)``, and ``(ref, its worker/)`` when a ref is given."""
    import run

    return [("tree", None)] + ([(ref, run.worker_source(ref))] if ref else [])


def alternate(
    variants: list[tuple[str, str | None]], repeat: int, per_job: Callable[[str, str | None], float], **record: Any
) -> dict[str, list[float]]:
    """``per_job(name, src)`` for each variant, ``repeat`` rounds alternated; each run printed as a JSON line (with
    ``record``'s fields) and on stderr as it ends."""
    out: dict[str, list[float]] = {name: [] for name, _ in variants}
    for rep in range(repeat):
        for name, src in variants:
            t = time.monotonic()
            value = per_job(name, src)
            out[name].append(value)
            line = {"type": "run", "variant": name, "rep": rep + 1, **record, "instructions_per_job": round(value)}
            print(json.dumps(line), flush=True)
            print(f"  [{rep + 1}/{repeat}] {name}: {value:,.0f} ({time.monotonic() - t:.0f}s)", file=sys.stderr)
    return out


def report(title: str, per_job: dict[str, list[float]]) -> None:
    """The medians as JSON lines, then a table: one row a variant, with each run's figure."""
    for name, values in per_job.items():
        print(json.dumps({"type": "median", "variant": name, "instructions_per_job": round(statistics.median(values))}))
    print(f"\n| {title} | instructions/job (median) | runs |\n|---|---:|---|")
    for name, values in per_job.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {', '.join(f'{v:,.0f}' for v in values)} |")
