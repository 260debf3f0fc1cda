"""Every private name of a dependency the project uses is listed in jf_core/pins.py with the versions it was
written against: each exists in the installed version, the installed versions are the pinned ones (so the
refusal never fires here), pyproject.toml pins the same ranges, and another version is refused naming both."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

from jf_core import pins

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("distribution", sorted(pins.PINS))
def test_every_pinned_private_name_exists_in_the_installed_version(distribution):
    pin = pins.PINS[distribution]
    assert pins.supported(distribution), (distribution, importlib.metadata.version(distribution), pin.versions)
    for use in pin.uses:
        module, _, attribute = use.partition(":")
        loaded = importlib.import_module(module)
        assert not attribute or hasattr(loaded, attribute), f"{use} is gone from {distribution}"


def test_pyproject_pins_the_same_ranges():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for rs in project["optional-dependencies"].values() for r in rs]
    for distribution, pin in pins.PINS.items():
        found = [r for r in requirements if re.match(rf"{distribution}(\[[^]]*\])?[<>=!~]", r)]
        assert found, f"{distribution} is not required in pyproject.toml"
        for requirement in found:
            spec = re.sub(rf"^{distribution}(\[[^]]*\])?", "", requirement)
            if pin.refuse:  # a refused version must not be installable
                assert spec == pin.versions, (requirement, pin.versions)


def test_the_private_names_in_the_code_are_the_pinned_ones():
    """A private name of ray, gguf or transformers used anywhere in the code is listed (and so checked)."""
    listed = {part for pin in pins.PINS.values() for use in pin.uses for part in re.split(r"[.:]", use)}
    used = set()
    for folder in ("jf_core", "infra", "tasks", "flows", "jf_cli"):
        for path in (ROOT / folder).rglob("*.py"):
            code = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
            for module, names in re.findall(r"from ((?:ray|gguf|transformers)[\w.]*) import ([^\n(]+)", code):
                used |= {p for p in module.split(".") if p.startswith("_")}
                used |= {n.strip().split(" as ")[0] for n in names.split(",") if n.strip().startswith("_")}
            for chain in re.findall(r"\b(?:ray|gguf|transformers)(?:\.\w+)+", code):
                used |= {p for p in chain.split(".") if p.startswith("_")}
    assert used, "the code was read"
    assert used - listed - {"__version__"} == set()


def test_another_version_is_refused_naming_both(monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "2.99.0" if d == "ray" else real(d))
    with pytest.raises(pins.UnsupportedVersion, match=r"ray 2\.99\.0 is installed.*ray>=2\.60,<2\.61"):
        pins.require("ray")
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "5.99.0" if d == "transformers" else real(d))
    assert pins.require("transformers") is False  # cosmetic: skipped, not refused
