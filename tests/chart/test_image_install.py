"""IMAGE TEST (marker `image`): the Dockerfile's install steps, run in a fresh virtualenv instead of a container.

No Docker daemon exists on our machines, so this replays what the two stages do: build the skiplock wheel
(the builder's `pip wheel`), install `skiplock[operator]` from that wheel only (`--no-index --find-links`, no
cache) into an empty environment, then run the entry point. Offline and quick (about 3 s): the dependencies
are not downloaded again but taken from the test venv's site-packages, appended *after* the new environment's
own, so `skiplock` itself can only come from the wheel. Not covered: the base image, apt/OS layers, the USER
switch and the BuildKit bind mount (see docs/image.md, "What was and was not exercised").
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from chart.chartlib import ROOT

pytestmark = pytest.mark.image


def run(*cmd: str | Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, check=False, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    # The builder stage: `pip wheel` of the project (its dependencies are checked below, not rebuilt).
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-cache-dir",
        "--no-build-isolation",
        "--no-deps",
        "-q",
        "--wheel-dir",
        out,
        ROOT,
    )
    wheels = list(out.glob("skiplock-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_dir = tmp_path_factory.mktemp("image") / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", env_dir)
    python = env_dir / "bin" / "python"
    # The runtime stage's install, flags included; --no-deps because the index is not used here.
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-cache-dir",
        "--no-index",
        "--no-deps",
        "--find-links",
        wheel.parent,
        "skiplock[operator]",
    )
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    # Dependencies from the test venv, after the new environment's own site-packages.
    (Path(purelib) / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir


def image_env() -> dict[str, str]:
    # What the Dockerfile sets; no PYTHONPATH leaking in from the test run, no repository folders.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SKIPLOCK_", "VIRTUAL_ENV"))}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": "/app"}


def test_wheel_holds_both_packages_and_the_sql(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("skiplock/") for n in names)
    assert "skiplock_operator/__init__.py" in names
    assert any(n.startswith("skiplock/sql/migrations/") and n.endswith(".sql") for n in names)
    assert any(n.startswith("skiplock/sql/queries/") and n.endswith(".sql") for n in names)
    assert not any(n.startswith(("tests/", "operator/", "worker/", "charts/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "skiplock = skiplock.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_entry_point_runs_from_the_installed_wheel(venv: Path, tmp_path: Path) -> None:
    before = sorted(p for p in venv.rglob("*"))
    help_text = run(venv / "bin" / "skiplock", "--help", env=image_env(), cwd=tmp_path).stdout
    for command in ("worker", "operator", "migrate", "enqueue"):
        assert command in help_text
    run(venv / "bin" / "skiplock", "operator", "--help", env=image_env(), cwd=tmp_path)
    run(venv / "bin" / "skiplock", "worker", "--help", env=image_env(), cwd=tmp_path)
    # Nothing is written next to the code at start-up: a read-only root filesystem is enough, and the
    # bytecode was compiled by pip at install time (PYTHONDONTWRITEBYTECODE does not stop that).
    assert sorted(p for p in venv.rglob("*")) == before
    assert list(venv.rglob("skiplock/__pycache__/cli.*.pyc"))
    assert not list(tmp_path.iterdir())


def test_packages_come_from_the_wheel_and_the_operator_extra_imports(venv: Path, tmp_path: Path) -> None:
    probe = textwrap.dedent("""
        import skiplock, skiplock_operator, kopf, kubernetes, psycopg, psycopg_pool, prometheus_client
        print(skiplock.__file__)
        print(skiplock_operator.__file__)
    """)
    files = run(venv / "bin" / "python", "-c", probe, env=image_env(), cwd=tmp_path).stdout.split()
    for path in files:
        assert Path(path).is_relative_to(venv), f"{path} is not from the installed wheel"


def test_declared_dependencies_are_satisfied(venv: Path, tmp_path: Path) -> None:
    """Every requirement of skiplock[operator] (from the wheel's metadata) is met by what was imported."""
    probe = textwrap.dedent("""
        from importlib.metadata import requires, version
        from packaging.requirements import Requirement
        missing = []
        for text in requires("skiplock"):
            req = Requirement(text)
            if req.marker and not req.marker.evaluate({"extra": "operator"}):
                continue
            try:
                found = version(req.name)
            except Exception:
                missing.append(f"{req} (absent)")
                continue
            if found not in req.specifier:
                missing.append(f"{req} (found {found})")
        print("\\n".join(missing))
    """)
    assert run(venv / "bin" / "python", "-c", probe, env=image_env(), cwd=tmp_path).stdout.strip() == ""
