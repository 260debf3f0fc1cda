"""The registered model: an HF checkpoint with its jacobi_forcing block, logged as MLflow models-from-code (no
pickle) with jf_core as its code, a signature with params, pinned requirements; resolvable from `models:/` URIs;
loadable in a fresh virtual environment holding only its declared requirements."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlflow
import pytest

from jacobi_forcing.tasks import mlflow_runs, model_package
from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import StopTokens
from jf_core.decoding.multiblock import JFDecodeConfig
from jf_core.decoding.sampling import Sampling
from jf_core.models import load_model
from tests.conftest import serving_prior

PROMPTS = ["program: a=85; step -8; return f", "program: a=3; step +2; step -1; return c"]


@pytest.fixture()
def registered(tmp_path, monkeypatch, profile):
    """The test profile's model with a tuned decode config and a crossover, registered as version 1, `champion`."""
    from dataclasses import asdict

    from jf_core.model_dir import save_decode_config, update_block

    monkeypatch.setenv("JF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    model_dir = tmp_path / "model"
    shutil.copytree(profile.model.path, model_dir)
    (model_dir / "done.json").write_text("{}")  # a training summary: about the model, not part of the artifact
    tuned = JFDecodeConfig(block_size=8, num_blocks=2, pool_size=2, max_new_tokens=24)
    save_decode_config(model_dir, tuned)
    (model_dir / "decode_tuning.json").write_text('{"trials": []}')  # the tune stage's marker: not in the artifact
    update_block(model_dir, **serving_prior(ar_above_batch=4, break_even_tpf=1.5).block())
    p = profile.model_copy(update={"registry": profile.registry.model_copy(update={"tracking_uri": uri})})
    client, run_id = round_run(p)
    with tempfile.TemporaryDirectory() as tmp, mlflow.start_run(run_id=run_id):
        info = model_package.log_model(model_dir, Path(tmp), fallback_decode=None)
    version = mlflow.register_model(info.model_uri, "jf-test").version
    client.set_registered_model_alias("jf-test", "champion", version)
    return {"profile": p, "model_dir": model_dir, "tuned": asdict(tuned), "uri": uri, "tmp": tmp_path}


def round_run(profile):
    """A run in the round's experiment, as a round logs its model: MLflow's default experiment keeps artifacts under
    ./mlruns of the working directory (the repository, when the suite runs)."""
    client, experiment = mlflow_runs.connect(profile)
    return client, mlflow_runs.start_run(client, experiment, "round")


def greedy_texts(model_dir, prompts, max_new_tokens: int) -> list[str]:
    model, tok = load_model(str(model_dir))
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    out = ar_decode(model, ids, max_new_tokens=max_new_tokens, stop=StopTokens(tok.eos_token_id, 0))
    return [tok.decode(s, skip_special_tokens=True) for s in out.sequences]


def sampled_texts(model_dir, prompts, max_new_tokens: int, sampling, seeds) -> list[str]:
    model, tok = load_model(str(model_dir))
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    stops = StopTokens(tok.eos_token_id, 0)
    out = ar_decode(model, ids, max_new_tokens=max_new_tokens, sampling=sampling, seeds=seeds, stop=stops)
    return [tok.decode(s, skip_special_tokens=True) for s in out.sequences]


def test_the_registered_model_is_code_and_an_hf_checkpoint_with_its_decode_block(registered):
    from mlflow.models import Model

    local = Path(mlflow.artifacts.download_artifacts("models:/jf-test@champion", dst_path=str(registered["tmp"] / "d")))
    meta = Model.load(str(local / "MLmodel"))
    flavor = meta.flavors["python_function"]
    assert "python_model" not in flavor and not list(local.rglob("*.pkl"))  # models-from-code: nothing pickled
    assert flavor["model_code_path"].endswith("mlflow_model.py")
    assert (local / "code" / "jf_core" / "serving" / "engine.py").is_file()
    assert not list((local / "code").rglob("__pycache__"))
    assert not any((local / "code").glob("tasks")) and not any((local / "code").glob("flows"))
    params = {p.name: p.default for p in meta.signature.params.params}
    assert params == {  # the tuned config's budget; greedy unless a temperature is given
        "max_new_tokens": 24,
        "block_size": 0,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "seed": -1,
    }
    requirements = (local / "requirements.txt").read_text().split()
    assert {r.split("==")[0] for r in requirements} >= {"torch", "transformers", "mlflow"}
    assert all("==" in r and "+" not in r for r in requirements if not r.startswith("-")), requirements
    assert not any("jacobi" in r for r in requirements)

    checkpoint = model_package.checkpoint_of(local)
    assert sorted(p.name for p in checkpoint.iterdir() if p.name.endswith(".json") and "token" not in p.name) == [
        "config.json",
        "generation_config.json",
    ]
    block = json.loads((checkpoint / "config.json").read_text())["jacobi_forcing"]
    assert block["decode"] == registered["tuned"] and block["ar_above_batch"] == 4 and block["hardware"] == "test CPU"
    # Any HF runtime loads it for plain AR: transformers keeps the block as an unknown config key.
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert hf.config.jacobi_forcing["decode"]["block_size"] == 8


def test_predict_returns_greedy_ar_texts_and_honours_its_params(registered):
    model = mlflow.pyfunc.load_model("models:/jf-test@champion")
    assert model.predict(PROMPTS) == greedy_texts(registered["model_dir"], PROMPTS, 24)
    short = model.predict(PROMPTS, params={"max_new_tokens": 5, "block_size": 4})
    assert short == greedy_texts(registered["model_dir"], PROMPTS, 5)
    sampled = model.predict(PROMPTS, params={"temperature": 2.0, "top_k": 8, "seed": 10})
    assert sampled == sampled_texts(registered["model_dir"], PROMPTS, 24, Sampling(2.0, top_k=8), seeds=[10, 11])


def test_served_bad_requests_get_a_400_with_the_reason_and_no_traceback(registered, monkeypatch):
    """`mlflow models serve`'s app (MLflow's own scoring server, in process): a request the model cannot serve is a
    400 naming what is wrong, without the Python traceback it used to carry; a good request still predicts."""
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    monkeypatch.setenv("_MLFLOW_IS_IN_SERVING_ENVIRONMENT", "false")  # init sets it for the whole process
    client = TestClient(scoring_server.init(mlflow.pyfunc.load_model("models:/jf-test@champion")))
    for body, says in (
        ({"inputs": [""]}, "prompt: empty"),
        ({"inputs": [PROMPTS[0]], "params": {"temperature": -1.0}}, "temperature must be >= 0, got -1.0"),
    ):
        response = client.post("/invocations", json=body)
        error = response.json()
        assert response.status_code == 400 and says in error["message"], error
        assert error["error_code"] == "INVALID_PARAMETER_VALUE" and "Traceback" not in response.text, error
    good = client.post("/invocations", json={"inputs": PROMPTS, "params": {"max_new_tokens": 24}})
    assert good.status_code == 200 and good.json()["predictions"] == greedy_texts(registered["model_dir"], PROMPTS, 24)


def test_models_uris_resolve_to_the_checkpoint_and_bad_ones_are_named(registered):
    path = Path(model_package.resolve_model("models:/jf-test@champion", registered["profile"]))
    assert (path / "config.json").is_file() and "jacobi_forcing" in json.loads((path / "config.json").read_text())
    assert model_package.resolve_model("models:/jf-test/1", registered["profile"]) == str(path)  # downloaded once
    load_model(str(path))
    with pytest.raises(ValueError, match="has no alias 'nope'"):
        model_package.resolve_model("models:/jf-test@nope", registered["profile"])
    with pytest.raises(ValueError, match="has no version '7'"):
        model_package.resolve_model("models:/jf-test/7", registered["profile"])
    # Every command names a model the same way (jf decode, eval, bench, serve): the CLI's one resolver
    from jf_cli.common import model_path

    assert model_path("models:/jf-test@champion") == str(path)  # MLFLOW_TRACKING_URI: the registry above
    assert model_path(str(registered["model_dir"])) == str(registered["model_dir"])


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_fresh_venv_with_only_the_declared_requirements_loads_and_predicts(registered):
    """No editable install of this project: the model's requirements.txt into a new venv, then load by URI."""
    local = Path(mlflow.artifacts.download_artifacts("models:/jf-test/1", dst_path=str(registered["tmp"] / "d")))
    venv = registered["tmp"] / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py, requirements = venv / "bin" / "python", local / "requirements.txt"
    install = subprocess.run(
        # --no-compile: byte-compiling every installed module (torch's, transformers', MLflow's) was most of the
        # install's time here (130 s with it, 44 s without); the load below compiles only what it imports (11 s
        # instead of 6 where PYTHONDONTWRITEBYTECODE is set, as on this project's machines).
        [str(py), "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check", "-r", str(requirements)],
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    script = (
        "import json, sys, mlflow\n"
        "try:\n    import jf_core\nexcept ImportError:\n    pass\nelse:\n    sys.exit('jf_core is installed here')\n"
        "m = mlflow.pyfunc.load_model('models:/jf-test@champion')\n"
        "print(json.dumps(m.predict(json.loads(sys.argv[1]), params={'max_new_tokens': 24})))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(
        [str(py), "-c", script, json.dumps(PROMPTS)],
        env={**env, "MLFLOW_TRACKING_URI": registered["uri"]},
        cwd=registered["tmp"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == greedy_texts(registered["model_dir"], PROMPTS, 24)


def test_bench_decode_takes_its_jf_model_from_the_registry(registered, capsys):
    """`jf bench decode --jf-model models:/jf-test@champion` (it failed with transformers' "Repo id must use
    alphanumeric chars" when only `--model` went through the CLI's resolver): the registered checkpoint's rows."""
    import yaml

    from jf_cli.common import model_path
    from jf_cli.main import main

    profile_yaml = registered["tmp"] / "profile.yaml"
    profile_yaml.write_text(yaml.safe_dump(registered["profile"].model_dump(mode="json")))
    out = registered["tmp"] / "bench"
    argv = ["bench", "decode", "--profile", str(profile_yaml), "--num-prompts", "2", "--repeats", "1"]
    argv += ["--block-sizes", "4", "--jf-model", "models:/jf-test@champion", "--batch-sizes", "1", "--out", str(out)]
    assert main(argv) == 0
    data = json.loads((out / "bench.json").read_text())  # one batch size: no per-size folders
    assert data["meta"]["jf_model"] == model_path("models:/jf-test@champion")
    assert all(m["identical_fraction"] == 1.0 for k, m in data["methods"].items() if k.startswith("jf_"))


def test_a_draft_adapter_travels_with_its_model_through_the_registry(registered):
    """A model directory that keeps a draft-only LoRA registers with it, loads back from `models:/` with it, and its
    served decode (multi-block, recycling: the tuned config) drafts with it and answers the base's greedy text."""
    import torch

    from jf_core.draft_adapter.adapter import FILE, adapter_file, attach_draft_adapter, base_state_dict
    from jf_core.draft_adapter.config import DraftLora
    from jf_core.model_dir import save_model_dir

    base_dir = registered["model_dir"]
    model, tok = load_model(str(base_dir))
    adapter = attach_draft_adapter(model, DraftLora(rank=4))
    with torch.no_grad():
        for b in adapter.b.values():
            b.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    drafted = registered["tmp"] / "drafted"
    save_model_dir(model, drafted, tokenizer=tok, state_dict=base_state_dict(model),
                   extra_tensors={FILE: adapter_file(adapter)})  # fmt: skip
    for name in ("config.json", "generation_config.json"):  # the tuned decode block, as the round would keep it
        shutil.copy(base_dir / name, drafted / name)
    (drafted / "checksums.sha256").unlink()  # the copied config is not the bytes the manifest covered
    _, run_id = round_run(registered["profile"])
    with tempfile.TemporaryDirectory() as tmp, mlflow.start_run(run_id=run_id):
        info = model_package.log_model(drafted, Path(tmp), fallback_decode=None)
    version = mlflow.register_model(info.model_uri, "jf-draft").version
    path = Path(model_package.resolve_model(f"models:/jf-draft/{version}", registered["profile"]))
    assert (path / FILE).is_file()
    loaded, _ = load_model(str(path))
    assert loaded.jf_draft_adapter.rank == 4
    served = mlflow.pyfunc.load_model(f"models:/jf-draft/{version}")
    assert served.unwrap_python_model().engine.model.jf_draft_adapter.rank == 4  # the served model drafts with it
    assert served.predict(PROMPTS) == greedy_texts(base_dir, PROMPTS, 24)
