"""The evaluation of a model: accuracy on its benchmark and its speed against its own greedy AR, side by side.

One function, `evaluate_model`, serves the round (jf_core/round/stages.py), `jf eval` and `jf bench decode`:

1. **Quality**: every method decodes the whole evaluation set at the evaluation batch size: accuracy (each method's
   own texts, scored), TPF and acceptance, and identity with the model's greedy AR, per prompt identical or the
   first position where it diverges. The numerics contract decides what a difference means: in fp32 the decoders
   must reproduce greedy AR token for token, so a difference is a bug and raises `LosslessnessError`; in bf16/fp16
   a wide window and a one-token step run different kernels, near-tied argmaxes flip, and the difference is
   reported (every committed token is still the argmax of the forward that verified it).
2. **Speed**: the methods take turns on the speed prompts at the speed batch size (1 unless asked;
   `speed.run_interleaved`, each batch's fastest of `repeats` runs): TPS, and speedups against our AR on the same
   model (the headline) and HF generate (a row). When speed covers the whole set at the evaluation batch size (the
   bench), one pass serves both.
3. **Block size**: plain Jacobi's n is chosen by TPS on calibration prompts, taking turns likewise, never on the
   test timings. The headline speedup is that n's on the test prompts, or the tuned decode config's when the model
   has one (tuned on calibration prompts too).
4. **Controls and anchors**: every timed pass carries our AR twice (`ar_control`: its ratio to AR is the timer's
   bias and spread in this run), and a trained model's evaluation can carry its untrained anchors (`Untrained`):
   its input model decoded by HF prompt lookup and by our decoder with the config the same tune found on it, each
   checked against that model's own greedy AR, so "is training worth it?" is answered in the same run; a model with
   a draft adapter is also timed without it (`no_adapter_tuned`, jf_core/evaluation/anchors.py).

Prompts are rendered like the trajectories' prompts were (`prompts.format_prompt`: chat template and system prompt
from the profile), so a model is evaluated on inputs shaped like its training data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

import torch

from jf_core.config import EvalConfig, Profile
from jf_core.decoding import JacobiConfig, StopTokens, decode
from jf_core.draft_adapter.adapter import draft_adapter
from jf_core.evaluation.anchors import Untrained, no_adapter_methods, untrained_methods
from jf_core.evaluation.benchmarks import BenchmarkItem, load_benchmark, score
from jf_core.evaluation.degeneracy import output_stats
from jf_core.evaluation.method import AR, AR_CONTROL, TUNED, Method, jacobi
from jf_core.evaluation.methods import build_methods
from jf_core.evaluation.results import Calibration, Evaluation
from jf_core.evaluation.speed import Decoder, MethodResult, bench, run_interleaved
from jf_core.trajectory.prompt_source import HeldOutSlice
from jf_core.trajectory.prompts import PromptFormat, calibration_prompts, hash_split

EXACT_DTYPES = (torch.float32, torch.float64)


class LosslessnessError(AssertionError):
    """An exact decoder's output differed from greedy AR where the numerics promise identity (fp32)."""


@dataclass
class EvalSet:
    benchmark: str
    items: list[BenchmarkItem]
    prompts: list[list[int]]  # the items' rendered prompts, tokenized


def with_control(methods: dict[Method, Decoder], enabled: bool = True) -> dict[Method, Decoder]:
    """`methods` with our AR's decoder timed a second time as `ar_control`, right after AR (none without AR)."""
    if not enabled or AR not in methods:
        return methods
    out: dict[Method, Decoder] = {}
    for method, decoder in methods.items():
        out[method] = decoder
        if method == AR:
            out[AR_CONTROL] = decoder
    return out


def held_out(cfg: EvalConfig) -> Callable[[dict], bool] | None:
    """A filter over benchmark rows: those in `cfg.split` of the prompt file's hash splits (None: every row)."""
    if cfg.split is None or cfg.hash_splits is None:
        return None
    fractions, field = cfg.hash_splits
    return lambda row: hash_split(str(row.get(field, "")), fractions) == cfg.split


def eval_set(cfg: EvalConfig, tokenizer, fmt: PromptFormat, *, part: HeldOutSlice, limit: int | None = None) -> EvalSet:
    """The benchmark's held-out questions of the `part` half (a reported figure: confirmation; a decision:
    development), rendered and tokenized."""
    items = load_benchmark(
        cfg.benchmark,
        cfg.source,
        limit=limit or cfg.num_prompts,
        template=cfg.template,
        keep=held_out(cfg),
        held_out_slice=part,
        key=cfg.hash_splits[1] if cfg.hash_splits else None,
    )
    prompts = [tokenizer(fmt.render(i.prompt, tokenizer), add_special_tokens=False)["input_ids"] for i in items]
    return EvalSet(cfg.benchmark, items, prompts)


def evaluate_model(
    model: torch.nn.Module,
    tokenizer,
    cfg: EvalConfig,
    *,
    fmt: PromptFormat,
    stop: StopTokens,
    calibration: list[list[int]] | None = None,
    tuned: JacobiConfig | None = None,
    ar_above_batch: int | None = None,
    extra_methods: dict[Method, Decoder] | None = None,
    same_output_as: dict[Method, Method] | None = None,
    timed_only: Collection[Method] = (),
    exact_methods: Callable[[Method], bool] = lambda method: method.ours,
    progress: Callable[[str], None] | None = None,
) -> Evaluation:
    """Evaluate `model` (see the module docstring); `stop` is `models.stop_tokens(model, tokenizer)`.

    `extra_methods` (HF generate, prompt lookup, a second model's decoders) join every pass; `same_output_as` names
    the greedy reference of each (default: this model's AR). `exact_methods` says which methods the fp32 contract
    covers (ours; HF's own methods are rows to compare, not ours to guarantee). `ar_above_batch`: the tuned
    model's stored crossover, so its row (the headline) is what the model's dispatch delivers: AR at a batch size
    where AR was measured faster, the tuned config elsewhere. `timed_only`: methods that are references for the
    timing (the untrained anchors), run in the speed pass alone where it is a pass of its own, their outputs checked
    there against their `same_output_as`; the AR-against-AR control is always one of them."""
    started, dtype = time.perf_counter(), next(model.parameters()).dtype
    say = progress or (lambda _m: None)
    data = eval_set(cfg, tokenizer, fmt, part="confirmation")
    # The round's rows: our AR, plain Jacobi at each block size, the tuned config (methods.py builds every bench's).
    own = build_methods(
        model, stop, cfg.max_new_tokens, block_sizes=cfg.block_sizes, tuned=tuned, ar_above_batch=ar_above_batch
    )
    methods = with_control({**own, **(extra_methods or {})}, cfg.control)
    speed_prompts = data.prompts[: cfg.speed_prompts]
    one_pass = len(speed_prompts) == len(data.prompts) and cfg.speed_batch_size == cfg.batch_size
    # What only the timing needs (the control, the anchors) costs the quality pass its largest batches for nothing.
    skip = set() if one_pass else {AR_CONTROL, *timed_only}
    assessed = {m: d for m, d in methods.items() if m not in skip}
    quality = _pass(
        assessed, data.prompts, cfg, cfg.batch_size, one_pass, same_output_as, say, (data, tokenizer, stop.eos)
    )
    if dtype in EXACT_DTYPES:
        check_lossless(quality, exact_methods, dtype)
    speed = quality if one_pass else _pass(methods, speed_prompts, cfg, cfg.speed_batch_size, True, same_output_as, say)
    timed = {m: speed[m] for m in methods if m not in quality}
    if dtype in EXACT_DTYPES:
        check_lossless(timed, exact_methods, dtype)
    # A row dispatched by batch size (the tuned model's: AR above its crossover) decodes differently in the quality
    # pass's batches than in the speed pass's: its TPF is the speed pass's, measured with the speed it reports.
    dispatched = {TUNED} if ar_above_batch is not None and not one_pass else set()
    rows = {
        m.label: with_quality(speed[m], quality[m], tpf_from_speed=m in dispatched) if m in quality else timed[m]
        for m in methods
    }
    best_n, calibrated = choose_block_size(model, stop, cfg, calibration, say)
    return Evaluation(
        benchmark=data.benchmark,
        items=len(data.items),
        dtype=str(dtype).removeprefix("torch."),
        block_sizes=list(cfg.block_sizes),
        methods=rows,
        calibration=calibrated,
        speedup_block_size=best_n,
        headline_method=TUNED if TUNED in own else jacobi(best_n),
        decode_config=tuned or JacobiConfig(block_size=best_n, max_new_tokens=cfg.max_new_tokens),
        eval_seconds=time.perf_counter() - started,
        draft_adapter=draft_adapter(model) is not None,
    )


def _pass(
    methods: dict[Method, Decoder],
    prompts: list[list[int]],
    cfg: EvalConfig,
    batch_size: int,
    timed: bool,
    same_output_as: dict[Method, Method] | None,
    say: Callable[[str], None],
    quality: tuple[EvalSet, object, frozenset[int]] | None = None,
) -> dict[Method, MethodResult]:
    """One pass of `methods` over `prompts` at `batch_size`. With `quality` (the evaluation set, its tokenizer and
    the stop tokens): the quality pass, every method decoding the whole set for accuracy, TPF, identity and the
    outputs' statistics. `timed`: the methods take turns, each batch's fastest of `cfg.repeats` runs (more until each
    has `cfg.min_timed_seconds`); untimed, each batch runs once."""
    if quality is None:
        say(f"speed: {len(methods)} methods taking turns on {len(prompts)} prompts, batch {batch_size}, x{cfg.repeats}")
        scored = {}
    else:
        data, tokenizer, eos = quality
        say(f"quality: {len(methods)} methods on {len(prompts)} {data.benchmark} prompts, batch {batch_size}")
        scored = {
            "scorer": _scorer(tokenizer, data),
            "describe": lambda seqs: output_stats(seqs, cfg.max_new_tokens, eos),
        }
    timing = {"repeats": cfg.repeats, "min_seconds": cfg.min_timed_seconds} if timed else {}
    rows = bench(
        methods,
        prompts,
        batch_size=batch_size,
        **timing,
        **scored,
        same_output_as=same_output_as,
        progress=say,
    )
    return {r.method: r for r in rows}


def _scorer(tokenizer, data: EvalSet) -> Callable[[int, list[int]], bool]:
    """Whether a method's output for item i is correct; methods mostly agree, so each distinct text is scored once."""
    scores: dict[tuple[int, str], bool] = {}

    def scorer(i: int, seq: list[int]) -> bool:
        text = tokenizer.decode(seq, skip_special_tokens=True)
        if (i, text) not in scores:
            scores[(i, text)] = score(data.benchmark, data.items[i], text)
        return scores[(i, text)]

    return scorer


def check_lossless(quality: dict[Method, MethodResult], exact: Callable[[Method], bool], dtype: torch.dtype) -> None:
    """In fp32 the decoders reproduce greedy AR token for token: a method the contract covers that did not is an
    error naming it, the prompt and the token."""
    for name, r in quality.items():
        if exact(name) and r.identical_fraction < 1.0:
            bad = next(i for i, d in enumerate(r.first_divergence) if d is not None)
            raise LosslessnessError(
                f"{name} changed the greedy output in {dtype} (prompt {bad}, token {r.first_divergence[bad]}): "
                "in fp32 the decoders must reproduce greedy AR token for token"
            )


def with_quality(speed: MethodResult, quality: MethodResult, *, tpf_from_speed: bool = False) -> MethodResult:
    """A method's row: its speed from the speed pass, everything about its outputs from the quality pass (its TPF
    too, on more prompts, unless `tpf_from_speed`)."""
    acceptance = {} if tpf_from_speed else {
        "tpf": quality.tpf,
        "tpf_per_example": quality.tpf_per_example,
        "accepted_histogram": quality.accepted_histogram,
    }  # fmt: skip
    return replace(
        speed,
        accuracy=quality.accuracy,
        identical_fraction=quality.identical_fraction,
        first_divergence=quality.first_divergence,
        output_stats=quality.output_stats,
        **acceptance,
    )


def choose_block_size(
    model: torch.nn.Module,
    stop: StopTokens,
    cfg: EvalConfig,
    calibration: list[list[int]] | None,
    say: Callable[[str], None],
) -> tuple[int, Calibration]:
    """Plain Jacobi's block size with the best TPS on the calibration prompts (batch 1, taking turns)."""
    if len(cfg.block_sizes) == 1:
        return cfg.block_sizes[0], Calibration()
    if not calibration:
        raise ValueError("choosing among several block sizes needs calibration prompts")
    candidates = {
        str(n): (
            lambda ps, n=n: decode(model, ps, JacobiConfig(block_size=n, max_new_tokens=cfg.max_new_tokens), stop=stop)
        )
        for n in cfg.block_sizes
    }
    say(f"block size: n in {cfg.block_sizes} taking turns on {len(calibration)} calibration prompts")
    outputs = run_interleaved(
        candidates, calibration, 1, repeats=cfg.repeats, progress=say, min_seconds=cfg.min_timed_seconds
    )
    tps = {n: out.stats.tps for n, out in outputs.items()}
    return int(max(tps, key=tps.get)), Calibration(prompts=len(calibration), tps=tps)


def evaluate_profile(
    model_path: str,
    profile: Profile,
    *,
    loaded: tuple | None = None,
    extra_methods: dict[Method, Decoder] | None = None,
    same_output_as: dict[Method, Method] | None = None,
    untrained: Untrained | None = None,
    tuning: tuple[JacobiConfig, int | None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Evaluation:
    """`evaluate_model` for a model directory or hub id as a profile evaluates it: the profile's dtype, benchmark,
    prompt format and calibration prompts, and the model's tuned decode config when it has one, dispatched by its
    stored crossover (AR where AR was measured faster) as every consumer decodes it. `loaded`: (model, tokenizer)
    already loaded from `model_path` (`jf bench decode` evaluates one model at several batch sizes); `extra_methods`
    and `same_output_as` as `evaluate_model` takes them; `untrained`: the anchors' rows join every pass (with
    `evaluation.untrained`); `tuning`: a decode config and crossover tuned for this model elsewhere (the untrained
    tune of `jf bench decode`'s base), its `tuned` row where the model's directory stores none."""
    from jf_core.decoding import load_serving_spec
    from jf_core.models import load_model, stop_tokens

    cfg = profile.evaluation
    model, tok = loaded or load_model(model_path, **profile.model.decode_kwargs())
    spec = load_serving_spec(model_path, max_new_tokens=cfg.max_new_tokens)
    tuned, above = (spec.tuned, spec.ar_above_batch) if spec.tuned else (tuning or (None, None))
    if tuned is not None:
        tuned = replace(tuned, max_new_tokens=cfg.max_new_tokens)
    extra, same, anchors = dict(extra_methods or {}), dict(same_output_as or {}), []
    if untrained is not None and cfg.untrained:
        kwargs = profile.model.decode_kwargs()
        for rows, refs in (
            untrained_methods(untrained, cfg, kwargs),
            no_adapter_methods(untrained, model, tuned, above, cfg, kwargs),
        ):
            extra.update(rows)
            same.update(refs)
            anchors += list(rows)
    return evaluate_model(
        model,
        tok,
        cfg,
        fmt=PromptFormat.of(profile.prompts),
        stop=stop_tokens(model, tok),
        calibration=calibration_prompts(profile.prompts, tok, cfg.tune.prompts, cfg.calibration_split),
        tuned=tuned,
        ar_above_batch=above if tuned is not None else None,
        extra_methods=extra,
        same_output_as=same,
        timed_only=anchors,
        progress=progress,
    )
