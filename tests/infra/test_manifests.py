"""The cluster manifests keep the security promises: token auth on every KubeRay cluster, ClusterIP only, and the
RayService's application builder is importable with the arguments it is given."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import yaml

KUBERAY = Path(__file__).resolve().parents[2] / "infra" / "kuberay"


def test_every_kuberay_cluster_uses_token_auth_and_clusterip():
    for name, key in (("raycluster.yaml", None), ("rayservice.yaml", "rayClusterConfig")):
        spec = yaml.safe_load((KUBERAY / name).read_text())["spec"]
        cluster = spec[key] if key else spec
        assert cluster["authOptions"] == {"mode": "token", "secretName": "jf-ray-auth"}, name
        assert cluster["headGroupSpec"]["serviceType"] == "ClusterIP", name


def test_the_rayservice_application_builder_takes_its_args():
    spec = yaml.safe_load((KUBERAY / "rayservice.yaml").read_text())["spec"]
    app = yaml.safe_load(spec["serveConfigV2"])["applications"][0]
    module, _, attr = app["import_path"].partition(":")
    build = getattr(importlib.import_module(module), attr)
    from jacobi_forcing.infra.serve_app import ServeOptions

    fields = set(inspect.signature(ServeOptions).parameters) | {"replicas"}
    assert set(app["args"]) <= fields and callable(build)
    assert app["args"]["model_path"].startswith("models:/") and app["args"]["model_path"].endswith("@champion")
