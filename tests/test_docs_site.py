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
    pages = sorted(p.relative_to(ROOT / "docs").with_suffix("") for p in (ROOT / "docs").rglob("*.md"))
    assert len(pages) >= 20, pages  # the guide's pages and the experiment records
    built = [site / (p.parent if p.name == "index" else p) / "index.html" for p in pages]
    assert [str(p) for p, html in zip(pages, built, strict=True) if not html.is_file()] == []
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
        p.read_text() for p in [ROOT / "README.md", ROOT / "infra/README.md", *(ROOT / "docs").rglob("*.md")]
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


# A path that means something on one machine only: a home, a scratch or temporary directory, a mount.
MACHINE_PATH = re.compile(r"(?<![\w.$])/(?:root|home|Users|tmp|work|mnt|scratch)/")


def test_no_doc_or_data_file_names_a_path_of_a_particular_machine():
    """Docs and their data files name files by their path in the repository (or `$JF_HOME/...`): a session's scratch
    directory means nothing to the next reader."""
    files = [ROOT / "README.md", ROOT / "infra/README.md", *(p for p in (ROOT / "docs").rglob("*") if p.is_file())]
    texts = [(f, f.read_text()) for f in files if f.suffix in (".md", ".json", ".jsonl", ".yaml", ".csv")]
    assert len(texts) >= 30, "the scan reads the docs and their data"
    found = [f"{f.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}: {text[m.start() : m.start() + 60]}"
             for f, text in texts for m in MACHINE_PATH.finditer(text)]  # fmt: skip
    assert found == []


def results_rows() -> list[str]:
    """The rows of the README's results table (after its header and separator)."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Results", 1)[1].split("\n\n| what |", 1)[1].split("\n\n", 1)[0]
    return table.splitlines()[2:]


def test_every_results_row_is_one_line_linking_its_record_and_data_file():
    """The README's results table is a summary: each row one line, linking the page or record that measured it and
    naming the data file under docs/ that holds its figures."""
    rows = results_rows()
    assert len(rows) >= 5, rows
    for row in rows:
        assert row.startswith("|") and row.endswith("|"), f"a results row spans lines: {row[:80]}"
        assert re.search(r"\]\(docs/[^)]+\.md(#[^)]*)?\)", row), f"no link to its record: {row[:80]}"
        data = re.findall(r"`(docs/data/[^`]+)`", row)
        assert data, f"no data file named: {row[:80]}"
        assert all((ROOT / d).exists() for d in data), data
