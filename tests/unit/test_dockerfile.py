"""The Dockerfile, read as text (no Docker daemon here): stages, user, entrypoint, labels and install hygiene.

What this cannot prove (a real `docker build` and a container run) is listed in README.md ("What was and was
not exercised"); the install steps themselves run in a fresh virtualenv in tests/chart/test_image_install.py.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"

    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert m, f"cannot parse FROM {rest}"
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda v: args[v[1] or v[2]], m[1])
            stages.append(Stage(base=base, name=m[2]))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())[1]


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


def run_commands(stage: Stage) -> list[str]:
    """Each shell command of the stage's RUN instructions (split at && and ;), without RUN flags."""
    out = []
    for args in stage.all("RUN"):
        script = re.sub(r"^(--\S+\s+)+", "", args)
        out += [cmd.strip() for cmd in re.split(r"&&|;", script) if cmd.strip()]
    return out


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for token in shlex.split(args):
            key, _, value = token.partition("=")
            env[key] = value
    return env


def test_multi_stage_with_a_builder(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    assert stages[0].name == "builder"
    builder_runs = " ".join(run_commands(stages[0]))
    assert "pip wheel" in builder_runs or "python -m build" in builder_runs


def test_both_stages_use_slim_python_3_11_or_later(stages: list[Stage]) -> None:
    for stage in stages:
        m = re.fullmatch(r"python:3\.(\d+)-slim(-\w+)?", stage.base)
        assert m and int(m[1]) >= 11, f"stage {stage.name}: base {stage.base}"
    assert stages[0].base == stages[-1].base, "builder and runtime must share the Python ABI"


def test_final_stage_installs_the_operator_extra_from_the_wheel_only(final: Stage) -> None:
    installs = [c for c in run_commands(final) if "pip install" in c]
    assert len(installs) == 1
    install = installs[0]
    assert "--no-index" in install and "--find-links" in install
    assert "skiplock[operator]" in install
    runs = " ".join(final.all("RUN"))
    assert "from=builder" in runs and "type=bind" in runs, "wheels must be bind-mounted, not copied into a layer"


def test_no_compilers_caches_or_sources_in_the_final_stage(final: Stage) -> None:
    text = " ".join(args for _, args in final.instructions)
    for tool in ("gcc", "build-essential", "g++", "make ", "python3-dev", "libpq-dev", "apt-get install"):
        assert tool not in text, f"{tool!r} in the final stage"
    assert not final.all("ADD")
    assert not final.all("COPY"), "the final stage copies nothing: the wheel arrives by bind mount"


def test_every_pip_install_skips_the_cache(stages: list[Stage]) -> None:
    for stage in stages:
        for cmd in run_commands(stage):
            if re.search(r"\bpip3? (install|wheel)\b", cmd):
                assert "--no-cache-dir" in cmd, f"stage {stage.name}: {cmd}"


def test_numeric_non_root_user(final: Stage) -> None:
    users = final.all("USER")
    assert users, "no USER in the final stage"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) == 10001, users[-1]
    assert not group or (group.isdigit() and int(group) != 0)
    runs = " ".join(run_commands(final))
    assert "--uid 10001" in runs, "the user must exist in /etc/passwd too"
    # USER comes after every RUN, so nothing runs as root at container start.
    keywords = [kw for kw, _ in final.instructions]
    assert keywords.index("USER") > max(i for i, kw in enumerate(keywords) if kw == "RUN")


def test_entrypoint_is_the_skiplock_cli_in_exec_form(final: Stage) -> None:
    entrypoint = final.all("ENTRYPOINT")
    assert len(entrypoint) == 1
    assert json.loads(entrypoint[0]) == ["skiplock"]
    cmd = final.all("CMD")
    assert not cmd or isinstance(json.loads(cmd[-1]), list), "CMD in exec form"


def test_python_environment(final: Stage) -> None:
    env = env_of(final)
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"  # a read-only root filesystem cannot take .pyc files
    assert env.get("PYTHONUNBUFFERED") == "1"
    assert env.get("PYTHONPATH") == "/app", "handler images COPY their code to /app"
    assert final.all("WORKDIR")[-1] == "/app"


def test_oci_labels(final: Stage) -> None:
    text = " ".join(final.all("LABEL"))
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[\w.]+)="?([^"\s]*)', text))
    for key in ("title", "description", "version", "revision", "licenses", "source"):
        assert f"org.opencontainers.image.{key}" in labels, key
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    args = dict(a.partition("=")[::2] for a in final.all("ARG"))
    assert args["VERSION"] == pyproject["version"]
    assert labels["org.opencontainers.image.licenses"] == pyproject["license"]


def test_builder_copies_only_what_the_wheel_needs(stages: list[Stage]) -> None:
    copied = []
    for args in stages[0].all("COPY"):
        *sources, _dest = shlex.split(args)
        copied += [s for s in sources if not s.startswith("--")]
    assert set(copied) == {"pyproject.toml", "README.md", "worker", "operator"}
    for path in copied:
        assert (ROOT / path).exists(), path


def test_dockerignore_allows_only_the_build_inputs() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*", "allow-list: start by excluding everything"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "worker", "operator"}
    assert "**/__pycache__" in rules


def test_the_parser_reads_continuations_and_comments() -> None:
    args, stages = parse(
        "# syntax=docker/dockerfile:1\nARG B=python:3.12-slim\nFROM ${B} AS one\n"
        "RUN a \\\n    # inner comment\n    && b\nFROM one\nUSER 1:1\n"
    )
    assert args == {"B": "python:3.12-slim"}
    assert [(s.base, s.name) for s in stages] == [("python:3.12-slim", "one"), ("one", None)]
    assert run_commands(stages[0]) == ["a", "b"]
