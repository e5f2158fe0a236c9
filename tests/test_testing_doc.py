"""docs/testing.md's pytest example, run as a reader runs it: the README's ``myapp/tasks.py``, the page's conftest
and test file in a project folder, against a fresh database. ``python -m pytest`` passes, a bare ``pytest`` needs the
page's ``pythonpath`` setting (and without it fails the way the page says)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from test_readme import README, blocks, reader_database  # noqa: F401 - the fixture is used by name

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs/testing.md"


def project(folder: Path) -> None:
    """The reader's project: the README's tasks, and each block of the page that names its file."""
    [tasks] = [b for b in blocks(README.read_text(encoding="utf-8")) if b.mark == "file: myapp/tasks.py"]
    files = {"myapp/tasks.py": tasks.body}
    for b in blocks(PAGE.read_text(encoding="utf-8")):
        if b.lang == "python" and (named := re.match(r"# (tests/\S+\.py)\n", b.body)):
            files[named[1]] = b.body
    assert set(files) == {"myapp/tasks.py", "tests/conftest.py", "tests/test_receipts.py"}, set(files)
    for path, body in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(body, encoding="utf-8")


def pytest_in(folder: Path, dsn: str, *command: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TEST_DATABASE_URL"] = dsn
    return subprocess.run(
        [*command, "-q", "-p", "no:cacheprovider"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_the_pytest_example_passes_as_the_page_says(reader_database: str, tmp_path: Path) -> None:  # noqa: F811
    project(tmp_path)
    with_module = pytest_in(tmp_path, reader_database, sys.executable, "-m", "pytest")
    assert with_module.returncode == 0 and "2 passed" in with_module.stdout, with_module.stdout + with_module.stderr

    bare = pytest_in(tmp_path, reader_database, "pytest")
    assert bare.returncode != 0 and "No module named 'myapp'" in bare.stdout + bare.stderr, bare.stdout

    [toml] = [b.body for b in blocks(PAGE.read_text(encoding="utf-8")) if b.lang == "toml"]
    (tmp_path / "pyproject.toml").write_text(toml, encoding="utf-8")
    configured = pytest_in(tmp_path, reader_database, "pytest")
    assert configured.returncode == 0 and "2 passed" in configured.stdout, configured.stdout + configured.stderr
