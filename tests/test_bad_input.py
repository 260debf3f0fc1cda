"""Bad input, counted: one table across the CLI, flow parameters, prefect.yaml overrides, profiles, prompt files,
trajectory shards, model directories and registry URIs. Each case gets the exact error text (the field, file or
value it names) and leaves nothing written: the directory it ran in holds exactly the inputs it was given.
(Rejections at `prefect deployment run`, by the server's parameter schema, are in tests/flows/test_deployments.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml


@dataclass(frozen=True)
class Case:
    id: str
    area: str
    provoke: Callable[[Path], object]  # gets a directory holding only this case's inputs
    message: str  # the exact text (after {tmp} is filled in) the error must contain


def cli(*argv: str) -> Callable[[Path], object]:
    def run(tmp: Path):
        from jf_cli.main import main

        return main([a.replace("{tmp}", str(tmp)) for a in argv])

    return run


def profile_file(data) -> Callable[[Path], object]:
    def run(tmp: Path):
        from jf_core.config import load_profile

        (tmp / "p.yaml").write_text(yaml.safe_dump(data))
        return load_profile(str(tmp / "p.yaml"))

    return run


def prompts(text: str, name: str = "prompts.jsonl", **cfg) -> Callable[[Path], object]:
    def run(tmp: Path):
        from jf_core.toy.tokenizer import build_tokenizer
        from jf_core.trajectory.prompts import PromptSourceConfig, load_prompts

        (tmp / name).write_text(text)
        return load_prompts(PromptSourceConfig(source=str(tmp / name), **cfg), build_tokenizer())

    return run


def shard(make: Callable[[Path], None], **kwargs) -> Callable[[Path], object]:
    def run(tmp: Path):
        from jf_core.trajectory.store import read_shard

        make(tmp / "s.parquet")
        return read_shard(tmp / "s.parquet", **kwargs)

    return run


def model_dir(make: Callable[[Path], None]) -> Callable[[Path], object]:
    def run(tmp: Path):
        from jf_core.models import load_model

        (tmp / "m").mkdir()
        make(tmp / "m")
        return load_model(str(tmp / "m"))

    return run


def registry(uri: str, *, store_exists: bool = True) -> Callable[[Path], object]:
    def run(tmp: Path):
        from mlflow import MlflowClient

        from jacobi_forcing.tasks.model_package import resolve_model
        from jf_core.config import load_profile

        store = f"sqlite:///{tmp / 'mlflow.db'}"
        if store_exists:
            MlflowClient(store, store).search_experiments()  # creates the store: the case is the model, not it
        profile = load_profile("tiny", registry={"tracking_uri": store})
        return resolve_model(uri, profile)

    return run


def flow_parameters(**params) -> Callable[[Path], object]:
    def run(_tmp: Path):
        from jacobi_forcing.flows.round import jf_round

        return jf_round.validate_parameters(params)

    return run


def deployment_overrides(overrides: dict) -> Callable[[Path], object]:
    def run(_tmp: Path):
        from jf_core.config import ProfileOverrides

        return ProfileOverrides.model_validate(overrides)

    return run


def benchmark(name: str, text: str | None) -> Callable[[Path], object]:
    def run(tmp: Path):
        from jf_core.evaluation.benchmarks import load_benchmark

        if text is not None:
            (tmp / "b.jsonl").write_text(text)
        return load_benchmark(name, str(tmp / "b.jsonl"))

    return run


def _garbage(path: Path) -> None:
    path.write_bytes(b"PAR1 not really")


def _foreign_table(path: Path) -> None:
    pq.write_table(pa.table({"prompt_id": ["a"], "tokens": [[1, 2]]}), path)


def _config_only(path: Path) -> None:
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))


def _load_profile(tmp: Path):
    from jf_core.config import load_profile

    return load_profile(str(tmp / "absent.yaml"))


def _absent_prompts(tmp: Path):
    from jf_core.trajectory.prompts import PromptSourceConfig, read_rows

    return list(read_rows(PromptSourceConfig(source=str(tmp / "absent.jsonl"))))


def _absent_shard(tmp: Path):
    from jf_core.trajectory.store import read_shard

    return read_shard(tmp / "absent.parquet")


BENCHMARKS = "Input should be 'embedded', 'humaneval', 'mbpp', 'gsm8k' or 'math'"
CASES = [
    Case("cli-unknown-profile", "CLI", cli("run", "--profile", "nope"), "unknown profile 'nope'; available:"),
    Case("cli-set-no-dot", "CLI", cli("plan", "--set", "steps=3"), "--set expects section.key=value, got 'steps=3'"),
    Case("cli-set-unknown-field", "CLI", cli("plan", "--set", "training.stpes=3"), "training.stpes\n  Extra inputs"),
    Case(
        "cli-set-out-of-range",
        "CLI",
        cli("plan", "--set", "training.steps=0"),
        "training.steps\n  Input should be greater than or equal to 1",
    ),
    Case(
        "cli-missing-model",
        "CLI",
        cli("decode", "--model", "{tmp}/absent", "--prompt", "a"),
        "model directory {tmp}/absent does not exist",
    ),
    Case(
        "cli-workers-without-strategy",
        "CLI",
        cli("plan", "--set", "compute.train_workers=2"),
        "compute.train_workers=2 needs training.strategy ddp or fsdp2",
    ),
    Case(
        "cli-ar-mix-on-workers",
        "CLI",
        cli("plan", "--set", "training.strategy=ddp", "--set", "compute.train_workers=2"),
        "training.mix_ar_every=4 mixes AR batches in one training process: strategy ddp",
    ),
    Case(
        "cli-ar-mix-without-the-embedded-task",
        "CLI",
        cli("plan", "--set", "prompts.source={tmp}/p.jsonl"),
        "prompts.source '{tmp}/p.jsonl' has none (set training.mix_ar_every=0)",
    ),
    Case(
        "cli-eval-missing-benchmark",
        "CLI",
        cli("eval", "--benchmark", "gsm8k", "--source", "{tmp}/absent.jsonl"),
        "benchmark file {tmp}/absent.jsonl does not exist",
    ),
    Case("profile-missing-file", "profile", _load_profile, "profile file {tmp}/absent.yaml does not exist"),
    Case(
        "profile-unknown-section",
        "profile",
        profile_file({"name": "x", "trainig": {"steps": 3}}),
        "trainig\n  Extra inputs are not permitted",
    ),
    Case("profile-bad-name", "profile", profile_file({"name": "a/b"}), "profile name must be a plain non-empty word"),
    Case(
        "profile-not-a-mapping",
        "profile",
        profile_file(["name", "x"]),
        "{tmp}/p.yaml must be a mapping of sections (name, model, training, ...), got a list",
    ),
    Case(
        "profile-offload-without-fsdp2",
        "profile",
        profile_file({"name": "x", "training": {"cpu_offload": True}}),
        "training.cpu_offload needs training.strategy fsdp2",
    ),
    Case(
        "profile-unknown-benchmark",
        "profile",
        profile_file({"name": "x", "evaluation": {"benchmark": "mmlu"}}),
        f"evaluation.benchmark\n  {BENCHMARKS}",
    ),
    Case(
        "flow-unknown-section",
        "flow parameters",
        flow_parameters(profile="tiny", overrides={"trainig": {"steps": 3}}),
        "overrides.trainig: Extra inputs are not permitted",
    ),
    Case(
        "flow-wrong-type",
        "flow parameters",
        flow_parameters(profile="tiny", overrides={"training": {"steps": "three"}}),
        "overrides.training.steps: Input should be a valid integer",
    ),
    Case(
        "deployment-unknown-field",
        "prefect.yaml overrides",
        deployment_overrides({"evaluation": {"num_prompt": 5}}),
        "evaluation.num_prompt\n  Extra inputs are not permitted",
    ),
    Case(
        "deployment-section-not-a-mapping",
        "prefect.yaml overrides",
        deployment_overrides({"training": 3}),
        "training\n  Input should be a valid dictionary",
    ),
    Case("prompts-missing-file", "prompt file", _absent_prompts, "prompt file {tmp}/absent.jsonl does not exist"),
    Case(
        "prompts-bad-json",
        "prompt file",
        prompts('{"prompt": "a"}\n{"prompt": \n'),
        "{tmp}/prompts.jsonl:2: not valid JSON",
    ),
    Case(
        "prompts-not-an-object",
        "prompt file",
        prompts('{"prompt": "a"}\n[1, 2]\n'),
        "{tmp}/prompts.jsonl:2: expected a JSON object, got list",
    ),
    Case(
        "prompts-duplicate-ids",
        "prompt file",
        prompts('{"id": 1, "prompt": "a=1"}\n{"id": 1, "prompt": "a=2"}\n', id_field="id"),
        "{tmp}/prompts.jsonl: prompt ids are not unique (id_field='id')",
    ),
    Case(
        "prompts-bad-parquet",
        "prompt file",
        prompts("not parquet", name="p.parquet"),
        "{tmp}/p.parquet: cannot read as Parquet",
    ),
    Case("shard-missing", "trajectory shard", _absent_shard, "shard {tmp}/absent.parquet does not exist"),
    Case(
        "shard-not-parquet",
        "trajectory shard",
        shard(_garbage),
        "shard {tmp}/s.parquet is not a readable Parquet file",
    ),
    Case(
        "shard-foreign-schema",
        "trajectory shard",
        shard(_foreign_table),
        "{tmp}/s.parquet is not a jf trajectory shard: missing columns ['block_index', 'fixed_point',",
    ),
    Case(
        "shard-tampered",
        "trajectory shard",
        shard(_foreign_table, expected_sha256="0" * 64),
        "shard {tmp}/s.parquet does not match the manifest's content hash (changed or corrupted)",
    ),
    Case(
        "model-dir-empty",
        "model directory",
        model_dir(lambda _p: None),
        "{tmp}/m has no config.json: not a Hugging Face model directory",
    ),
    Case(
        "model-dir-no-weights",
        "model directory",
        model_dir(_config_only),
        "'{tmp}/m' has no safetensors weights (model.safetensors or its index); pickled weights",
    ),
    Case(
        "registry-no-alias",
        "registry URI",
        registry("models:/jf-nope@champion"),
        "model models:/jf-nope@champion: registered model 'jf-nope' has no alias 'champion' in the registry at "
        "sqlite:///{tmp}/mlflow.db",
    ),
    Case(
        "registry-no-store",
        "registry URI",
        registry("models:/jf-tiny@champion", store_exists=False),
        "model models:/jf-tiny@champion: there is no MLflow store at sqlite:///{tmp}/mlflow.db",
    ),
    Case(
        "registry-no-version",
        "registry URI",
        registry("models:/jf-nope/3"),
        "model models:/jf-nope/3: registered model 'jf-nope' has no version '3' in the registry at "
        "sqlite:///{tmp}/mlflow.db",
    ),
    Case(
        "benchmark-missing-field",
        "benchmark file",
        benchmark("gsm8k", '{"question": "1+1?"}\n'),
        "{tmp}/b.jsonl: row 0 lacks field(s) answer needed by gsm8k",
    ),
]


# What the cases themselves put in their directory (the registry store a URI points at included).
INPUTS = {"p.yaml", "prompts.jsonl", "p.parquet", "s.parquet", "m", "m/config.json", "b.jsonl", "mlflow.db"}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_the_table_counts_at_least_25_cases_across_every_area():
    assert len(CASES) >= 25 and len({c.id for c in CASES}) == len(CASES)
    areas = {c.area for c in CASES}
    assert {"CLI", "flow parameters", "prefect.yaml overrides", "profile", "prompt file", "trajectory shard"} <= areas
    assert {"model directory", "registry URI"} <= areas


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_naming_it_and_nothing_is_written(case, tmp_path, monkeypatch, capsys):
    inputs = tmp_path / "case"
    inputs.mkdir()
    monkeypatch.setenv("JF_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(inputs)
    given = _files(inputs)
    with pytest.raises((Exception, SystemExit)) as raised:
        case.provoke(inputs)
    message = capsys.readouterr().err if raised.type is SystemExit else str(raised.value)
    expected = case.message.replace("{tmp}", str(inputs))
    assert expected in message, f"{case.id}: {message!r}"
    written = _files(inputs) - given - INPUTS
    assert not written, f"{case.id} wrote {written}"
    home = tmp_path / "home"
    assert not home.exists() or not [p for p in home.rglob("*") if p.is_file()], f"{case.id} wrote {_files(home)}"
