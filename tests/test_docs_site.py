"""The documentation site builds in MkDocs' strict mode (a broken link or anchor, a page missing from the nav, an
API reference that does not resolve: each fails the build), a broken link is caught rather than shipped, and the
README stays a front page whose links into the docs land on pages and headings that exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner (2027-05) is not our output


def build(project: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(project / "mkdocs.yml"), "-d", str(site)],
        cwd=project, capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT, out)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_site_builds_in_strict_mode_with_every_page(site):
    pages = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    assert len(pages) >= 10, pages
    assert [p for p in pages if not (site / ("" if p == "index" else p) / "index.html").is_file()] == []
    api = (site / "api" / "index.html").read_text()
    assert "jf_core.decoding.jacobi" in api and "JacobiConfig" in api  # the reference came from the docstrings


@pytest.mark.parametrize(
    "broken",
    ["See [the missing page](nowhere.md).", "See [a missing heading](decoding.md#no-such-heading)."],
    ids=["page", "anchor"],
)
def test_a_broken_link_fails_the_build(tmp_path, broken):
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for package in ("jf_core",):  # the API page's references resolve against the code
        os.symlink(ROOT / package, tmp_path / package)
    page = tmp_path / "docs" / "concepts.md"
    page.write_text(page.read_text() + f"\n{broken}\n")
    done = build(tmp_path, tmp_path / "site")
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-2000:]
    assert re.search(r"WARNING .*(nowhere\.md|no-such-heading)", said), said[-2000:]


def test_the_readme_is_a_front_page_whose_links_land(site):
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150, "the README is a front page: the depth goes in docs/"
    links = re.findall(r"\]\((docs/[^)#]+)(?:#([^)]+))?\)", text)
    assert len(links) >= 10, links
    for target, anchor in links:
        assert (ROOT / target).is_file(), target
        if anchor:
            html = (site / Path(target).relative_to("docs").with_suffix("") / "index.html").read_text()
            assert f'id="{anchor}"' in html, f"README links to {target}#{anchor}, which has no such heading"


def test_every_jf_subcommand_is_documented():
    """What `jf --help` lists, the README or the docs show in use (`jf bench forward`, `jf prompts add`, ...)."""
    import argparse

    from jf_cli.main import build_parser

    text = "\n".join(
        p.read_text() for p in [ROOT / "README.md", ROOT / "infra/README.md", *(ROOT / "docs").glob("*.md")]
    )

    def commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
        out = []
        for action in parser._actions:  # argparse keeps its subcommands here: no public accessor
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out += [f"{prefix}{name}", *commands(sub, f"{prefix}{name} ")]
        return out

    listed = commands(build_parser())
    assert len(listed) >= 20, listed
    assert [c for c in listed if not re.search(rf"\bjf {re.escape(c)}\b", text)] == []
