"""prefect.yaml: every deployment names a real flow and parameters the typed config accepts."""

from __future__ import annotations

from jf_core.config import load_profile


def test_prefect_yaml_deployments_use_valid_profiles():
    """Every deployment in prefect.yaml names a flow that exists and parameters the typed config accepts."""
    import importlib
    from pathlib import Path

    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "prefect.yaml").read_text())
    names = set()
    for d in spec["deployments"]:
        path, func = d["entrypoint"].split(":")
        module = path.removesuffix(".py").replace("/", ".")
        flow = getattr(importlib.import_module(module), func)
        names.add(f"{flow.name}/{d['name']}")
        params = d.get("parameters", {})
        if "profile" in params:
            load_profile(params["profile"], **params.get("overrides", {}))
        assert d["work_pool"]["name"] == "jf-pool"
    assert {"jf-round/tiny", "jf-round/qwen2.5-coder-7b", "jf-round/retrain-tiny", "jf-progressive/tiny"} <= names
    retrain = next(d for d in spec["deployments"] if d["name"] == "retrain-tiny")
    assert retrain["schedules"][0]["cron"] and retrain["parameters"]["model"] == "models:/jf-tiny@champion"
