"""README.md, followed as typed: its marked shell and Python blocks run in order against a real PostgreSQL.

The convention (HTML comments, invisible on GitHub) is the line right before a fenced block:

- ``<!-- run -->`` before a ``sh`` or ``python`` block: run it; it must exit 0. Shell blocks run with
  ``bash -e -o pipefail``, Python blocks with this interpreter, both in one scratch directory (the reader's
  project) with the virtualenv's ``bin`` first on ``PATH``.
- ``<!-- file: path -->`` before a block: write the block to ``path`` in that directory (a file the reader
  creates, such as ``myapp/tasks.py``).
- ``<!-- run: background -->`` before a ``sh`` block: start it (a worker) and wait, with a deadline, until no due
  job is left pending or processing; run the blocks after it; at the end stop it with SIGTERM, which must end
  it with exit code 0 (a clean drain).

Unmarked blocks are not run: installing the package (done by ``make install``), ``kubectl`` and ``helm``
against a cluster. Those are checked without one: every ``helm install`` of the README renders with the real
helm (as ``helm template``, the same arguments), and every file ``kubectl apply -f`` names exists and parses.

The database is a fresh one created for the test on the server of SKIPLOCK_TEST_DSN (or the fallback
server), so the README's defaults (schema ``skiplock``, tables ``orders``...) are used as typed and touch
nobody else's data; ``DATABASE_URL`` points at it, as the README tells the reader to set.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg import sql
from psycopg.conninfo import make_conninfo

from chart.chartlib import find_helm, run_helm
from support.ci import missing
from support.pg import wait_for

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^(?:<!-- (?P<mark>[^>]*?) -->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    mark: str  # "run", "run: background", "file: PATH", or "" (not run)
    lang: str
    body: str
    line: int

    def __str__(self) -> str:
        return f"README.md line {self.line} ({self.lang}, {self.mark or 'not run'})"


def blocks(text: str) -> list[Block]:
    return [
        Block((m["mark"] or "").strip(), m["lang"], m["body"], text.count("\n", 0, m.start("body")))
        for m in FENCE.finditer(text)
    ]


def test_the_convention_finds_the_blocks_a_reader_runs() -> None:
    found = blocks(README.read_text(encoding="utf-8"))
    marks = [b.mark for b in found]
    assert "run" in marks and "run: background" in marks and any(m.startswith("file: ") for m in marks)
    for b in found:
        assert b.mark in ("", "run", "run: background") or b.mark.startswith("file: "), f"unknown mark in {b}"
        if b.mark.startswith("run"):
            assert b.lang in ("sh", "python"), f"{b}: only sh and python blocks can run"
        if b.mark == "run: background":
            assert b.lang == "sh", f"{b}: a background block is a shell command"
    assert {b.lang for b in found if b.mark == "run"} == {"sh", "python"}


def test_the_parser_reads_marks_languages_and_bodies() -> None:
    text = (
        "x\n<!-- run -->\n```sh\necho hi\n```\n\n```python\nprint(1)\n```\n"
        "<!-- file: a/b.py -->\n```python\nX = 1\n```\n"
    )
    assert [(b.mark, b.lang, b.body) for b in blocks(text)] == [
        ("run", "sh", "echo hi\n"),
        ("", "python", "print(1)\n"),
        ("file: a/b.py", "python", "X = 1\n"),
    ]


@pytest.fixture
def reader_database(pg_dsn: str) -> Iterator[str]:
    name = f"readme_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(pg_dsn, dbname=name)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def due_jobs_left(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM skiplock.jobs WHERE status IN ('pending', 'processing') AND visible_at <= now()"
        ).fetchone()
    return row[0] if row else 0


def test_readme_blocks_run_as_typed(reader_database: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["DATABASE_URL"] = reader_database
    background: list[tuple[Block, subprocess.Popen[str]]] = []
    ran = 0
    try:
        for block in blocks(README.read_text(encoding="utf-8")):
            if block.mark.startswith("file: "):
                target = tmp_path / block.mark.removeprefix("file: ")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.body, encoding="utf-8")
            elif block.mark == "run":
                command = ["bash", "-e", "-o", "pipefail", "-c", block.body]
                if block.lang == "python":
                    command = [sys.executable, "-c", block.body]
                out = subprocess.run(
                    command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
                )
                assert out.returncode == 0, f"{block} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
                ran += 1
            elif block.mark == "run: background":
                proc = subprocess.Popen(
                    ["bash", "-e", "-c", block.body],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
                background.append((block, proc))
                wait_for(
                    lambda proc=proc: proc.poll() is not None or due_jobs_left(reader_database) == 0,
                    timeout=60,
                    what=f"{block} to run the jobs enqueued before it",
                )
                assert proc.poll() is None, f"{block} exited early:\n{proc.communicate()[0]}"
                ran += 1
    finally:
        for block, proc in background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                output, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
            assert proc.returncode == 0, f"{block} did not drain cleanly on SIGTERM ({proc.returncode}):\n{output}"
    assert ran >= 4
    with psycopg.connect(reader_database) as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM skiplock.jobs GROUP BY 1").fetchall())
        # The README cancels a job it enqueued for later; every other job ran.
        cancelled = conn.execute(
            "SELECT count(*) FILTER (WHERE visible_at > now()), count(*) FROM skiplock.jobs WHERE status = 'cancelled'"
        ).fetchone()
    assert statuses and set(statuses) <= {"done", "cancelled"}, f"every job the README enqueued ran: {statuses}"
    assert cancelled is not None and cancelled[0] == cancelled[1], "only the job enqueued for later was cancelled"


def shell_commands(text: str) -> list[str]:
    """The commands of the README's unmarked sh blocks, continuation lines joined, comments dropped."""
    commands = []
    for b in blocks(text):
        if b.lang == "sh" and not b.mark:
            joined = b.body.replace("\\\n", " ")
            commands += [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]
    return commands


def test_every_helm_install_of_the_readme_renders() -> None:
    installs = [c for c in shell_commands(README.read_text(encoding="utf-8")) if c.startswith("helm install ")]
    assert installs, "the README shows how to install the chart"
    helm = find_helm()
    if helm is None:
        missing("helm not found in .cache/k8s-tools/helm/ or on PATH (run: bash tools/get-k8s-tools.sh)")
    for command in installs:
        args = shlex.split(command)[2:]
        out = run_helm(helm, "template", *args)
        assert out.returncode == 0, f"{command}\n{out.stderr}"
        assert "kind: Deployment" in out.stdout, command


def test_every_file_kubectl_applies_exists_and_parses() -> None:
    applies = [c for c in shell_commands(README.read_text(encoding="utf-8")) if c.startswith("kubectl ")]
    paths = [a.split(" -f ", 1)[1].split()[0] for a in applies if " apply -f " in a]
    assert paths, "the README applies the example manifests"
    for path in paths:
        target = ROOT / path
        files = sorted(target.glob("*.yaml")) if target.is_dir() else [target]
        assert files and all(f.is_file() for f in files), path
        for f in files:
            docs = [d for d in yaml.safe_load_all(f.read_text(encoding="utf-8")) if d]
            assert docs and all({"apiVersion", "kind", "metadata"} <= set(d) for d in docs), f
