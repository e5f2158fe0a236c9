"""The Dockerfile and its locks, read as text (no Docker daemon here): stages and targets, user, entrypoint,
labels, install hygiene, and hash-pinned dependencies that cover what pyproject.toml requires.

What this cannot prove (a real `docker build` and a container run) is listed in docs/image.md ("What was and was
not exercised"); the install steps themselves run in a fresh virtualenv in tests/chart/test_image_install.py.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LOCKS = ROOT / "requirements"
TARGETS = {"worker": "skiplock", "operator": "skiplock[operator,ui]"}
"""Each image target and the one unhashed thing it installs: our own wheel, built in the builder stage."""


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


def by_name(stages: list[Stage], name: str) -> Stage:
    found = [s for s in stages if s.name == name]
    assert len(found) == 1, f"one stage named {name!r}: {[s.name for s in stages]}"
    return found[0]


def lineage(stages: list[Stage], stage: Stage) -> list[Stage]:
    """The stage and the earlier stages it is built FROM, root first (what the image inherits)."""
    names = {s.name: s for s in stages[: stages.index(stage)] if s.name}
    chain = [stage]
    while chain[0].base in names:
        chain.insert(0, names[chain[0].base])
    return chain


def inherited(stages: list[Stage], stage: Stage) -> Stage:
    """One Stage with the instructions of the whole lineage, in order, based on the lineage's root image."""
    chain = lineage(stages, stage)
    return Stage(base=chain[0].base, name=stage.name, instructions=[i for s in chain for i in s.instructions])


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


def pip_commands(stage: Stage) -> list[str]:
    return [c for c in run_commands(stage) if re.search(r"\bpip3? (install|wheel|download)\b", c)]


def test_multi_stage_with_a_builder(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    assert stages[0].name == "builder"
    builder_runs = " ".join(run_commands(stages[0]))
    assert "pip wheel" in builder_runs or "python -m build" in builder_runs


def test_a_worker_and_an_operator_target_and_the_full_image_is_the_default(stages: list[Stage]) -> None:
    assert {s.name for s in stages} >= set(TARGETS)
    assert stages[-1].name == "operator", "a plain `docker build` gives the image with both entry points"
    for target in TARGETS:
        assert lineage(stages, by_name(stages, target))[0].name == "runtime", "both share one runtime stage"


def test_every_image_stage_uses_one_slim_python_3_11_or_later(stages: list[Stage]) -> None:
    names = {s.name for s in stages}
    roots = [s for s in stages if s.base not in names]
    for stage in roots:
        # A tag, or a tag pinned by digest (--build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...).
        m = re.fullmatch(r"python:3\.(\d+)-slim(-\w+)?(@sha256:[0-9a-f]{64})?", stage.base)
        assert m and int(m[1]) >= 11, f"stage {stage.name}: base {stage.base}"
    assert len({s.base for s in roots}) == 1, "builder and runtime must share the Python ABI"


def test_a_digest_pin_is_one_build_arg_away() -> None:
    args, stages = parse(DOCKERFILE.read_text())
    assert "PYTHON_IMAGE" in args, "the base image is an ARG, so a digest can be passed with --build-arg"
    pinned = "python:3.11-slim-bookworm@sha256:" + "0" * 64
    text = DOCKERFILE.read_text().replace(f"ARG PYTHON_IMAGE={args['PYTHON_IMAGE']}", f"ARG PYTHON_IMAGE={pinned}")
    assert {s.base for s in parse(text)[1] if s.name in ("builder", "runtime")} == {pinned}
    assert "--build-arg PYTHON_IMAGE=" in DOCKERFILE.read_text(), "the Dockerfile says how to pin by digest"
    runtime = by_name(stages, "runtime")
    assert "PYTHON_IMAGE" in runtime.all("ARG"), "the base.name label needs the ARG inside the stage"
    assert "${PYTHON_IMAGE}" in " ".join(runtime.all("LABEL"))


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_each_target_installs_locked_hashes_then_our_wheel_offline(stages: list[Stage], target: str) -> None:
    stage = by_name(stages, target)
    installs = pip_commands(stage)
    assert len(installs) == 2, installs
    locked, ours = installs
    for install in installs:
        assert "--no-index" in install and "--find-links" in install and "--no-deps" in install, install
    assert "--require-hashes" in locked and f"-r /wheels/{target}.lock" in locked, locked
    assert shlex.split(ours)[-1] == TARGETS[target] and "-r " not in ours, ours
    assert "python -m pip check" in run_commands(stage), "the installed set must be consistent"
    runs = " ".join(stage.all("RUN"))
    assert "from=builder" in runs and "type=bind" in runs, "wheels must be bind-mounted, not copied into a layer"


def test_the_builder_downloads_only_hashed_binary_wheels(stages: list[Stage]) -> None:
    builder = stages[0]
    for cmd in pip_commands(builder):
        if "pip download" in cmd or " -r " in cmd:
            assert "--require-hashes" in cmd and "--only-binary=:all:" in cmd and "--no-deps" in cmd, cmd
            assert "-r requirements/operator.lock" in cmd, "the operator lock holds every locked wheel"
        else:
            assert "--no-deps" in cmd, f"only our own wheel is built, nothing resolved: {cmd}"
    assert any("cp requirements/worker.lock requirements/operator.lock /wheels/" in c for c in run_commands(builder))


def test_no_compilers_caches_or_sources_in_the_images(stages: list[Stage]) -> None:
    for target in TARGETS:
        image = inherited(stages, by_name(stages, target))
        text = " ".join(args for _, args in image.instructions)
        for tool in ("gcc", "build-essential", "g++", "make ", "python3-dev", "libpq-dev", "apt-get install"):
            assert tool not in text, f"{tool!r} in the {target} image"
        assert not image.all("ADD")
        assert not image.all("COPY"), "the images copy nothing: the wheels arrive by bind mount"


def test_every_pip_install_skips_the_cache(stages: list[Stage]) -> None:
    for stage in stages:
        for cmd in pip_commands(stage):
            assert "--no-cache-dir" in cmd, f"stage {stage.name}: {cmd}"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_numeric_non_root_user(stages: list[Stage], target: str) -> None:
    stage = by_name(stages, target)
    users = stage.all("USER")
    assert users, f"no USER in the {target} stage"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) == 10001, users[-1]
    assert not group or (group.isdigit() and int(group) != 0)
    runs = " ".join(run_commands(inherited(stages, stage)))
    assert "--uid 10001" in runs, "the user must exist in /etc/passwd too"
    # USER comes after every RUN, so nothing runs as root at container start.
    keywords = [kw for kw, _ in stage.instructions]
    assert keywords.index("USER") > max(i for i, kw in enumerate(keywords) if kw == "RUN")
    assert "USER" not in [kw for s in lineage(stages, stage)[:-1] for kw, _ in s.instructions], (
        "the shared stage stays root, so each target can install before switching"
    )


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_entrypoint_is_the_skiplock_cli_in_exec_form(stages: list[Stage], target: str) -> None:
    image = inherited(stages, by_name(stages, target))
    entrypoint = image.all("ENTRYPOINT")
    assert len(entrypoint) == 1
    assert json.loads(entrypoint[0]) == ["skiplock"]
    cmd = image.all("CMD")
    assert not cmd or isinstance(json.loads(cmd[-1]), list), "CMD in exec form"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_python_environment(stages: list[Stage], target: str) -> None:
    image = inherited(stages, by_name(stages, target))
    env = env_of(image)
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"  # a read-only root filesystem cannot take .pyc files
    assert env.get("PYTHONUNBUFFERED") == "1"
    assert env.get("PYTHONPATH") == "/app", "handler images COPY their code to /app"
    assert image.all("WORKDIR")[-1] == "/app"


def test_oci_labels(stages: list[Stage], final: Stage) -> None:
    image = inherited(stages, final)
    text = " ".join(image.all("LABEL"))
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[\w.]+)="?([^"\s]*)', text))
    for key in ("title", "description", "version", "revision", "licenses", "source", "base.name"):
        assert f"org.opencontainers.image.{key}" in labels, key
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    args = dict(a.partition("=")[::2] for a in image.all("ARG"))
    assert args["VERSION"] == pyproject["version"]
    assert labels["org.opencontainers.image.licenses"] == pyproject["license"]


BUILD_INPUTS = {"pyproject.toml", "README.md", "worker", "operator", "requirements"}


def test_builder_copies_only_what_the_wheels_need(stages: list[Stage]) -> None:
    copied = []
    for args in stages[0].all("COPY"):
        *sources, _dest = shlex.split(args)
        copied += [s for s in sources if not s.startswith("--")]
    assert set(copied) == BUILD_INPUTS
    for path in copied:
        assert (ROOT / path).exists(), path


def test_dockerignore_allows_only_the_build_inputs() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*", "allow-list: start by excluding everything"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert allowed == BUILD_INPUTS
    assert "**/__pycache__" in rules


# ---------------------------------------------------------------------------------------------- the locks
@dataclass
class Pin:
    requirement: Requirement
    hashes: list[str]

    @property
    def version(self) -> str:
        (spec,) = self.requirement.specifier
        return spec.version


IMAGE_ENV = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "platform_machine": "x86_64",
}
"""The marker environment of the image (linux, CPython 3.11, as the base image and `make lock` say)."""


def read_lock(path: Path) -> dict[str, Pin]:
    """name -> pin, from a pip requirements file with --hash options and continuation lines."""
    logical, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip() if not raw.lstrip().startswith("--hash") else raw.rstrip()
        if not line.strip():
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    pins: dict[str, Pin] = {}
    for line in logical:
        text, *options = re.split(r"\s+(?=--)", line.strip())
        hashes = [o.removeprefix("--hash=") for o in options if o.startswith("--hash=")]
        assert len(hashes) == len(options), f"{path.name}: only --hash options expected: {line}"
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name not in pins, f"{path.name}: {name} pinned twice"
        pins[name] = Pin(req, hashes)
    return pins


@pytest.fixture(scope="module")
def locks() -> dict[str, dict[str, Pin]]:
    return {target: read_lock(LOCKS / f"{target}.lock") for target in TARGETS}


def declared(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in extras:
        texts += project["optional-dependencies"][extra]
    return [Requirement(t) for t in texts]


def applies(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(Marker(str(req.marker)).evaluate({**IMAGE_ENV, "extra": e}) for e in (extras or {""}))


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_pin_is_exact_and_hashed(locks: dict[str, dict[str, Pin]], target: str) -> None:
    assert locks[target], f"{target}.lock pins nothing"
    for name, pin in locks[target].items():
        assert str(pin.requirement.specifier).startswith("=="), f"{name}: not an exact pin"
        assert pin.hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in pin.hashes), name
    assert "skiplock" not in locks[target], "our own wheel is built from source, not locked"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_lock_covers_what_pyproject_requires_and_their_requirements(
    locks: dict[str, dict[str, Pin]], target: str
) -> None:
    """Every runtime requirement of skiplock (with the operator extra for the operator image) is pinned at an
    allowed version, and so is every requirement of each pinned package whose metadata is at hand (the test
    environment's, when it has the locked version): what `pip install --no-deps` leaves out must be in the lock."""
    pins = locks[target]
    extras = {"operator", "ui"} if target == "operator" else set()
    roots = [r for r in declared(tuple(extras)) if applies(r, extras)]
    queue = [(req, "skiplock (pyproject.toml)") for req in roots]
    seen: set[str] = set()
    expanded = 0
    while queue:  # every queued requirement applies in the image (markers evaluated before queueing)
        req, parent = queue.pop()
        name = canonicalize_name(req.name)
        assert name in pins, f"{target}.lock lacks {name} (required by {parent}): run `make lock`"
        assert req.specifier.contains(pins[name].version, prereleases=True), (
            f"{target}.lock pins {name}=={pins[name].version}, {parent} requires {req}: run `make lock`"
        )
        for extra in sorted(req.extras):  # psycopg[binary,pool]: the extras' packages, from the metadata below
            queue += [(r, f"{name}[{extra}]") for r in _requires(name, pins[name].version, extra) or []]
        if name in seen:
            continue
        seen.add(name)
        found = _requires(name, pins[name].version, None)
        if found is not None:
            expanded += 1
            queue += [(r, f"{name}=={pins[name].version}") for r in found]
    assert expanded >= len(roots), f"too few pinned packages could be checked against their metadata ({expanded})"
    if target == "worker":
        used = {name for name, pin in pins.items() if applies(pin.requirement, set())}
        assert used <= seen, f"worker.lock pins more than the worker needs: {sorted(used - seen)}"


def _requires(name: str, version: str, extra: str | None) -> list[Requirement] | None:
    """The requirements of ``name`` that apply in the image: its own (``extra`` None), or only those its ``extra``
    adds; None when the test environment does not hold that exact version."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    out = []
    for text in dist.requires or []:
        req = Requirement(text)
        own = req.marker is None or Marker(str(req.marker)).evaluate({**IMAGE_ENV, "extra": ""})
        with_extra = extra is not None and Marker(str(req.marker or "python_version > '0'")).evaluate(
            {**IMAGE_ENV, "extra": extra}
        )
        if (extra is None and own) or (extra is not None and with_extra and not own):
            out.append(req)
    return out


def test_the_worker_image_has_no_kubernetes_stack_and_agrees_with_the_operator_lock(
    locks: dict[str, dict[str, Pin]],
) -> None:
    worker, operator = locks["worker"], locks["operator"]
    for name in ("kopf", "kubernetes", "aiohttp"):
        assert name not in worker, f"{name} in the worker image"
        assert name in operator, f"{name} missing from the operator image"
    for name, pin in worker.items():
        assert name in operator, f"{name} in worker.lock only: the builder downloads operator.lock"
        assert pin.version == operator[name].version and set(pin.hashes) == set(operator[name].hashes), name


def test_make_lock_targets_the_image_python(stages: list[Stage]) -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lock:", makefile, re.MULTILINE), "a `make lock` target"
    assert "--generate-hashes" in makefile
    m = re.search(r"--python-version (3\.\d+)", makefile)
    base = re.fullmatch(r"python:(3\.\d+)-.*", stages[0].base)
    assert m and base and m[1] == base[1], "the lock is resolved for the image's Python"
    for target in TARGETS:
        assert f"-o requirements/{target}.lock" in makefile
        assert (LOCKS / f"{target}.lock").read_text().startswith("# This file was autogenerated"), target


def test_the_parser_reads_continuations_and_comments() -> None:
    args, stages = parse(
        "# syntax=docker/dockerfile:1\nARG B=python:3.12-slim\nFROM ${B} AS one\n"
        "RUN a \\\n    # inner comment\n    && b\nFROM one\nUSER 1:1\n"
    )
    assert args == {"B": "python:3.12-slim"}
    assert [(s.base, s.name) for s in stages] == [("python:3.12-slim", "one"), ("one", None)]
    assert run_commands(stages[0]) == ["a", "b"]
