"""The documentation: README stays short and its links resolve, the site builds strictly (a broken link fails
the build, and this test shows that it does), and the JobQueue reference is the one the CRD generates."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.ci import missing

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)#\s]+)(?:#[^)]*)?\)")


def mkdocs() -> str:
    path = Path(sys.executable).with_name("mkdocs")
    if path.exists():
        return str(path)
    found = shutil.which("mkdocs")
    if not found:
        missing("mkdocs not installed: pip install -e '.[docs]' (make install does it)")
    return found


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [mkdocs(), "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)},
    )


def test_readme_is_an_introduction_not_the_manual() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move reference material into docs/"


def test_readme_links_point_at_files_that_exist() -> None:
    targets = LINK.findall(README.read_text(encoding="utf-8"))
    assert targets, "README links into docs/"
    broken = sorted({t for t in targets if not (ROOT / t).exists()})
    assert broken == [], f"README links to missing files: {broken}"


def test_no_page_or_test_message_points_outside_the_repository() -> None:
    texts = [README, ROOT / "CHANGELOG.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("tests/**/*.py")]
    offenders = [
        str(p.relative_to(ROOT))
        for p in texts
        if p != Path(__file__) and re.search(r"TOOLING\.md|shared/[A-Z]", p.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_crd_reference_is_generated_from_the_current_crd() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools/gen-crd-docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    page = (ROOT / "docs/reference/crd.md").read_text(encoding="utf-8")
    assert "| `spec.queue` | string |" in page and "#### Rules checked on `spec`" in page


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    out = build(ROOT, tmp_path / "site")
    assert out.returncode == 0, out.stdout + out.stderr
    crd = (tmp_path / "site/reference/crd.html").read_text(encoding="utf-8")
    assert "spec.dsnSecretRef.name" in crd
    changelog = (tmp_path / "site/changelog.html").read_text(encoding="utf-8")
    assert "Keep a Changelog" in changelog, "the changelog page includes CHANGELOG.md"
    index = (tmp_path / "site/index.html").read_text(encoding="utf-8")
    assert 'href="getting-started.html"' in index, "links open from disk (file://): page.html, not page/"


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("mkdocs.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, copy / name)
    for name in ("docs", "examples"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "docs/index.md").open("a", encoding="utf-8") as f:
        f.write("\nSee [the missing page](no-such-page.md).\n")
    out = build(copy, tmp_path / "site")
    assert out.returncode != 0
    assert "no-such-page.md" in out.stdout + out.stderr


@pytest.mark.parametrize("page", ["worker.md", "testing.md", "reliability.md", "performance.md", "metrics.md"])
def test_the_pages_moved_out_of_the_readme_are_in_the_nav(page: str) -> None:
    assert re.search(rf":\s*{re.escape(page)}\s*$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
