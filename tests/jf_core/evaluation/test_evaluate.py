"""The one evaluation (accuracy + speed) the round, `jf eval` and the bench share: prompts rendered like the
trajectories' prompts, the fp32 identity contract enforced and the bf16 one reported, the HF baseline truly
greedy, the block size chosen on calibration prompts."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from jf_core.config import EvalConfig
from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import DecodeOutput, StopTokens
from jf_core.evaluation.evaluate import LosslessnessError, eval_set, evaluate_model
from jf_core.evaluation.method import AR, AR_CONTROL, jacobi
from jf_core.evaluation.methods import hf_generate_decoder
from jf_core.trajectory.prompts import PromptFormat, PromptSourceConfig, load_prompts
from tests.conftest import PAD, TINY_MODELS

# Qwen2.5-Instruct's chat template, shortened to what it does with a system and a user message.
QWEN_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture()
def gsm8k_file(tmp_path):
    rows = [
        {"question": f"What is {i} + 1?", "answer": f"{i}+1=<<{i}+1={i + 1}>>{i + 1}\n#### {i + 1}"} for i in range(12)
    ]  # 7 of them in the confirmation half the evaluation reads
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _cfg(source: str, **kw) -> EvalConfig:
    base = dict(
        benchmark="gsm8k",
        source=source,
        template="Q: {question} A:",
        num_prompts=5,
        speed_prompts=2,
        repeats=1,
        block_sizes=[4, 8],
        max_new_tokens=12,
        batch_size=2,
    )
    return EvalConfig(**{**base, **kw})


def _tokenizer():
    from jf_core.toy.tokenizer import build_tokenizer

    return build_tokenizer()


def _model(tok, dtype=torch.float32):
    from jf_core.toy.model import ToyModelConfig, build_model

    model = build_model(
        ToyModelConfig(hidden_size=32, num_hidden_layers=2, intermediate_size=64),
        len(tok),
        tok.pad_token_id,
        tok.eos_token_id,
        0,
    )
    return model.to(dtype).eval()


def _stop(tok):
    return StopTokens((tok.eos_token_id,), tok.pad_token_id)


def test_fp32_evaluation_is_identical_calibrated_and_complete(gsm8k_file):
    tok = _tokenizer()
    model = _model(tok)
    calibration = [tok(t, add_special_tokens=False)["input_ids"] for t in ("Q: 7 + 7? A:", "Q: 1 + 2? A:")]
    result = evaluate_model(model, tok, _cfg(gsm8k_file), fmt=PromptFormat(), stop=_stop(tok), calibration=calibration)
    assert result.dtype == "float32" and result.items == 5
    assert set(result.methods) == {"ar", "ar_control", "jacobi_n4", "jacobi_n8"}
    assert all(r.identical_fraction == 1.0 for r in result.rows())  # fp32: the contract is identity
    # The control: our AR timed again as one more method; its ratio to AR is this run's bias and spread.
    control = result.row(AR_CONTROL)
    assert control.tpf == 1.0 and result.timing_spread == abs(control.speedup_vs_ar - 1.0)
    assert result.metrics()["timing_spread"] == result.timing_spread
    assert all(d is None for r in result.rows() for d in r.first_divergence)
    assert result.calibration.prompts == 2 and set(result.calibration.tps) == {"4", "8"}
    best = max(result.calibration.tps, key=result.calibration.tps.get)
    assert result.speedup_block_size == int(best) and result.headline_method == jacobi(int(best))
    assert result.headline.speedup_vs_ar == pytest.approx(result.row(jacobi(int(best))).tps / result.row(AR).tps)
    assert 0.0 <= result.accuracy <= 1.0
    assert result.tpf == {str(n): result.row(jacobi(n)).tpf for n in (4, 8)}


def test_the_control_row_follows_ar_or_is_left_out_on_request(gsm8k_file):
    """The control is AR's decoder under a second row, right after AR (so it takes as many turns as AR), and
    `evaluation.control: false` leaves it out, and with it the spread."""
    tok = _tokenizer()
    model = _model(tok)
    on = evaluate_model(model, tok, _cfg(gsm8k_file, block_sizes=[4]), fmt=PromptFormat(), stop=_stop(tok))
    assert list(on.methods)[:2] == ["ar", "ar_control"] and on.timing_spread is not None
    assert on.row(AR_CONTROL).new_tokens == on.row(AR).new_tokens
    cfg = _cfg(gsm8k_file, block_sizes=[4], control=False)
    off = evaluate_model(model, tok, cfg, fmt=PromptFormat(), stop=_stop(tok))
    assert "ar_control" not in off.methods and off.timing_spread is None and "timing_spread" not in off.metrics()


def test_an_evaluation_reads_back_from_its_json_as_written(gsm8k_file, tmp_path):
    """The round caches an evaluation as JSON and the gate reads it back: every figure (NaN speedups and the
    integer keys of the acceptance histograms included) survives the trip, and a file of another shape is
    refused by field."""
    from pydantic import ValidationError

    from jf_core.evaluation.results import Evaluation

    tok = _tokenizer()
    result = evaluate_model(_model(tok), tok, _cfg(gsm8k_file, block_sizes=[4]), fmt=PromptFormat(), stop=_stop(tok))
    result.save(tmp_path / "eval.json")
    again = Evaluation.load(tmp_path / "eval.json")
    assert again.model_dump_json() == result.model_dump_json()
    assert math.isnan(again.row(AR).speedup_vs_hf_generate)  # no HF row in this evaluation
    assert all(isinstance(k, int) for k in again.row(jacobi(4)).accepted_histogram)
    assert again.headline_method == jacobi(4) and type(again.decode_config) is type(result.decode_config)
    old = json.loads((tmp_path / "eval.json").read_text())
    old["headline_tpf"] = 2.0  # a version-2 evaluation stored derived figures beside the rows
    with pytest.raises(ValidationError, match="headline_tpf"):
        Evaluation.model_validate(old)


def test_fp32_difference_is_a_bug_and_raises(gsm8k_file):
    """A decoder that changes the greedy output in fp32 is reported by name, prompt and token."""
    tok = _tokenizer()
    model = _model(tok)
    stop = _stop(tok)

    def off_by_one(prompts):
        out = ar_decode(model, prompts, max_new_tokens=12, stop=stop)
        return DecodeOutput([[*s[:2], (s[2] + 1) % 50, *s[3:]] for s in out.sequences], out.stats)

    cfg = _cfg(gsm8k_file, block_sizes=[4])
    message = r"broken_ar changed the greedy output in torch.float32 \(prompt 0, token 2"
    broken = {AR.of("broken"): off_by_one}
    with pytest.raises(LosslessnessError, match=message):
        evaluate_model(model, tok, cfg, fmt=PromptFormat(), stop=stop, extra_methods=broken)


def test_bf16_evaluation_reports_identity_instead_of_raising(gsm8k_file):
    """In bf16 a wide window and a one-token step run different kernels: differences are measured, not fatal."""
    tok = _tokenizer()
    model = _model(tok, torch.bfloat16)
    cfg = _cfg(gsm8k_file, block_sizes=[8], max_new_tokens=24)
    result = evaluate_model(model, tok, cfg, fmt=PromptFormat(), stop=_stop(tok))
    assert result.dtype == "bfloat16"
    fraction = result.row(jacobi(8)).identical_fraction
    diverged = result.row(jacobi(8)).first_divergence
    assert 0.0 <= fraction <= 1.0 and len(diverged) == 5
    assert fraction == sum(d is None for d in diverged) / 5


def test_chat_template_prompts_match_the_trajectory_prompt_format(tmp_path):
    """HumanEval prompts for a chat model are rendered exactly as the trajectory prompts were."""
    from jf_core.trajectory.prompts import held_out_slice

    tok = _tokenizer()
    tok.chat_template = QWEN_TEMPLATE
    record = {
        "task_id": "T/0",
        "prompt": 'def add(a, b):\n    """Add two numbers."""\n',
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
        "entry_point": "add",
    }
    (tmp_path / "he.jsonl").write_text(json.dumps(record) + "\n")
    system = "You are a careful Python programmer."
    cfg = EvalConfig(benchmark="humaneval", source=str(tmp_path / "he.jsonl"), num_prompts=1)
    half = held_out_slice(record["prompt"])  # the half this one question falls in
    got = eval_set(cfg, tok, PromptFormat(system_prompt=system), part=half).prompts[0]
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": record["prompt"]}) + "\n")
    trajectory = load_prompts(PromptSourceConfig(source=str(tmp_path / "train.jsonl"), system_prompt=system), tok)
    assert got == trajectory.items[0].token_ids
    text = tok.decode(got)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


def test_hf_generate_row_is_plain_greedy_under_a_qwen_generation_config():
    """A Qwen-style checkpoint ships repetition_penalty 1.05 and two EOS ids: the HF generate row ignores the
    penalty, stops on either EOS, and equals our greedy AR, one by one and in left-padded batches."""
    model = copy.deepcopy(TINY_MODELS["qwen2"]())
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16], [40, 41]]
    free = ar_decode(model, prompts, max_new_tokens=40, stop=StopTokens(None, PAD)).sequences
    eos = (free[0][6], free[2][9])  # two ids the model really emits: stopping on them matters
    model.generation_config.repetition_penalty = 1.05
    model.generation_config.eos_token_id = list(eos)
    model.generation_config.top_k, model.generation_config.top_p = 20, 0.8
    ours = ar_decode(model, prompts, max_new_tokens=40, stop=StopTokens(eos, PAD)).sequences
    assert any(s[-1] in eos and len(s) < 40 for s in ours)
    # Like with like: a left-padded row and the same prompt alone run different attention kernels, and a random
    # tiny model has near-ties that the last bit decides (which way depends on the CPU's kernels).
    alone = [ar_decode(model, [p], max_new_tokens=40, stop=StopTokens(eos, PAD)).sequences[0] for p in prompts]
    for batched, reference in ((False, alone), (True, ours)):
        hf = hf_generate_decoder(model, StopTokens(eos, PAD), 40, batched=batched)(prompts).sequences
        assert hf == reference, f"batched={batched}"
    assert model.generation_config.repetition_penalty == 1.05  # the checkpoint's config is left as it was
    # Control: generate() left to the checkpoint's config applies the penalty and is not greedy.
    inherited = [
        model.generate(torch.tensor([p]), max_new_tokens=40, pad_token_id=PAD)[0, len(p) :].tolist() for p in prompts
    ]
    assert [s[: len(o)] for s, o in zip(inherited, ours, strict=True)] != ours


def test_the_timing_spread_counts_a_tuned_row_its_crossover_sent_to_ar():
    """AR's work through the dispatch (a tuned row whose every prompt our AR decoded) is one more AR-against-AR pair:
    at batch 16 on the embedded model such a row read 0.83x while the control read 0.99x, so the control alone
    understated it. A Jacobi row that accepted nothing (TPF 1.0 too) did other work: not a pair."""
    from jf_core.decoding import JacobiConfig
    from jf_core.evaluation.method import TUNED, Method
    from jf_core.evaluation.results import Calibration, Evaluation
    from jf_core.evaluation.speed import MethodResult

    def row(method: Method, tpf: float, x: float, ar_share: float = 0.0) -> MethodResult:
        return MethodResult(method, tpf=tpf, tps=100 * x, decode_tps=None, prefill_seconds=None, seconds=1.0,
                            new_tokens=100, speedup_vs_ar=x, ar_share=ar_share)  # fmt: skip

    def spread(ar_share: float) -> float | None:
        rows = [row(AR, 1.0, 1.0, 1.0), row(AR_CONTROL, 1.0, 0.99, 1.0), row(TUNED, 1.0, 0.83, ar_share),
                row(jacobi(8), 3.0, 1.6)]  # fmt: skip
        return Evaluation(
            benchmark="embedded", items=1, dtype="float32", block_sizes=[8], calibration=Calibration(),
            methods={r.method.label: r for r in rows}, speedup_block_size=8, headline_method=TUNED,
            decode_config=JacobiConfig(block_size=8), eval_seconds=1.0,
        ).timing_spread  # fmt: skip

    assert spread(1.0) == pytest.approx(0.17)  # dispatched to AR: the same work as AR's row
    assert spread(0.5) == pytest.approx(0.01)  # half its batches Jacobi: not the same work
    assert spread(0.0) == pytest.approx(0.01)  # Jacobi at TPF 1.0: other work, not a pair (the control's 0.01 stands)
