"""The mechanism check: does training on a few questions' own Jacobi trajectories make the model decode those
questions in parallel, and what does it cost the model's text?

One run: the base model decodes `train` questions (their trajectories are collected) and `held_out` ones; then
each variant (training overrides of the profile, e.g. `state_pick: each_visit`, `mask: clean_context`,
`onpolicy_every: 20`) trains the base model on those trajectories through the round's own packing and training
driver (`train_round`), and its trained model is measured like the base:

- TPF of plain Jacobi at the trajectories' block size, on the trained questions and on the held-out ones (each
  block's first draft made as the trajectories' were: `trajectory.draft_init`);
- identity with its own greedy AR (the decoder's promise: must be 1.0 in fp32);
- identity with the *base* model's greedy AR (did the text change?) and the repeated-4-gram rate (did it degenerate?).

A TPF that comes with changed or degenerate text is not a result: the table puts them side by side. A variant with
`draft_lora` trains a draft-only adapter instead of the model (jf_core/draft_adapter/): its Jacobi
decoding drafts with the adapter and verifies with the base, so "= base text" is 1.0 by construction and measured.
`bench/mechanism.py` is the command; a CI test runs it on a tiny model.

Why 410 lines, and why here: it is still a second pipeline beside the round (its own collection, packing, resume
rule and rows); issue 50 makes its variants the round's own stages beside `jf_core/ablation.py`, and this module goes.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch

from jf_core.atomic import write_json_atomic, write_parquet_atomic
from jf_core.config import JFTrainConfig, Profile
from jf_core.decoding import JacobiConfig, StopTokens, ar_decode, jacobi_decode
from jf_core.decoding.draft import DraftInitName
from jf_core.evaluation.degeneracy import output_stats
from jf_core.evaluation.speed import first_divergence
from jf_core.evaluation.tables import markdown
from jf_core.models import load_model, stop_tokens
from jf_core.training.noise import NoiseSchedule
from jf_core.training.trainer import TrainSummary


@dataclass
class SetFigures:
    """One model on one question set."""

    tpf: float
    identical_to_own_ar: float
    identical_to_base: float
    repetition: float
    mean_length: float
    # How far the text stays the base model's before it departs: the median tokens in common from the start (an
    # unchanged answer counts its whole length). "= base" alone is all or nothing.
    base_prefix: float = 0.0
    accuracy: float | None = None  # the answers scored against the questions' references (None: not scored)
    outputs: list[list[int]] = field(repr=False, default_factory=list)  # greedy AR's new tokens


@dataclass
class MechanismRow:
    variant: str
    overrides: dict
    trained: SetFigures
    held_out: SetFigures
    train_seconds: float = 0.0
    train_tokens: int = 0  # tokens in the packed sequences trained on (both copies of every block, prompts)
    final: dict = field(default_factory=dict)  # the last logged training metrics
    trajectories: dict = field(default_factory=dict)  # the base row: the trajectory data's kind, tokens, seconds
    history: list[dict] = field(default_factory=list)  # training's logged rows (losses, on-policy TPF, probes)

    def summary(self) -> dict:
        out = asdict(self)
        for part in ("trained", "held_out"):
            out[part].pop("outputs")
        return out


def measure(
    model: torch.nn.Module,
    stop: StopTokens,
    prompts: Sequence[Sequence[int]],
    *,
    block_size: int,
    max_new_tokens: int,
    base_outputs: Sequence[Sequence[int]] | None,
    batch_size: int,
    references: Sequence[dict] | None = None,
    score: Callable[[list[int], dict], bool] | None = None,
    draft_init: DraftInitName = "prompt_sample",
) -> SetFigures:
    """Greedy AR and plain Jacobi at `block_size` on `prompts`, in batches (TPF is per sequence: batching does not
    change it), each block's first draft made by `draft_init`."""
    ar, jacobi, forwards, tokens = [], [], 0, 0
    cfg = JacobiConfig(block_size=block_size, max_new_tokens=max_new_tokens, draft_init=draft_init)
    with torch.no_grad():
        for first in range(0, len(prompts), batch_size):
            batch = list(prompts[first : first + batch_size])
            ar += ar_decode(model, batch, max_new_tokens=max_new_tokens, stop=stop).sequences
            out = jacobi_decode(model, batch, cfg, stop=stop)
            jacobi += out.sequences
            forwards += out.stats.forwards
            tokens += out.stats.new_tokens
    base = base_outputs if base_outputs is not None else ar
    stats = output_stats(ar, max_new_tokens, stop.eos)
    shared = [len(a) if (d := first_divergence(b, a)) is None else d for a, b in zip(ar, base, strict=True)]
    return SetFigures(
        tpf=tokens / max(forwards, 1),
        identical_to_own_ar=sum(a == j for a, j in zip(ar, jacobi, strict=True)) / len(ar),
        identical_to_base=sum(a == b for a, b in zip(ar, base, strict=True)) / len(ar),
        repetition=stats["repetition"],
        mean_length=stats["mean_length"],
        base_prefix=float(statistics.median(shared)),
        accuracy=(
            sum(score(list(a), ref) for a, ref in zip(ar, references, strict=True)) / len(ar)
            if score is not None and references is not None
            else None
        ),
        outputs=[list(a) for a in ar],
    )


def variant_profile(profile: Profile, overrides: dict) -> Profile:
    """The profile with training overrides applied and validated (a bad key or value is refused by name)."""
    training = JFTrainConfig.model_validate({**profile.training.model_dump(), **overrides})
    return profile.model_copy(update={"training": training})


def run_mechanism(
    profile: Profile,
    model_dir: str,
    variants: dict[str, dict],
    *,
    train: Sequence[Sequence[int]],
    held_out: Sequence[Sequence[int]],
    max_new_tokens: int,
    batch_size: int = 4,
    collect_batch_size: int | None = None,
    measure_trained: int | None = None,
    device: str = "cpu",
    workdir: Path | None = None,
    resume_dir: Path | None = None,
    keep: Path | None = None,
    references: tuple[Sequence[dict] | None, Sequence[dict] | None] | None = None,
    score: Callable[[list[int], dict], bool] | None = None,
    on_row: Callable[[MechanismRow], None] | None = None,
    progress: bool = False,
) -> list[MechanismRow]:
    """The base row, then one row per variant (see the module docstring). Trajectories are collected once, by the
    base model, with the profile's trajectory settings (kind included) at `max_new_tokens`, `collect_batch_size`
    prompts at a time (default: `batch_size`). TPF on the trained questions is measured on the first
    `measure_trained` of them (default: all; a GPU round trains on a thousand and measures a sample). Every model
    decodes in fp32 on `device`; training computes in the profile's model dtype there. With `keep`, each variant's
    trained model stays as `keep/<variant>` (for timing it: bench/real_round_speed.py); otherwise it is deleted once
    measured (a SmolLM2 model directory is 540 MB). With `references` (the source rows of the trained questions and
    of the held-out ones) and `score(answer tokens, row)`, each set's accuracy stands beside its TPF.

    With `resume_dir`, the run keeps its state there and a rerun with the same arguments goes on where the last one
    died (a long curve outlives a session's processes): the base row and the trajectories are read back
    (`base.json`, `trajectories.parquet`) instead of measured and collected again, a variant whose row is written
    (`<variant>/row.json`) is read back, and one that died training resumes from its last checkpoint on the
    examples it packed. Without it, a temporary directory under `workdir`, removed at the end."""
    n = profile.trajectory.block_size
    sample = list(train[:measure_trained] if measure_trained is not None else train)
    train_refs, held_refs = references or (None, None)
    train_refs = None if train_refs is None else list(train_refs)[: len(sample)]
    # Decoding drafts the way the trajectories were collected (`trajectory.draft_init`): one factor, both places.
    measured = partial(
        _measure_sets, sets=((sample, train_refs), (list(held_out), held_refs)), block_size=n,
        max_new_tokens=max_new_tokens, batch_size=batch_size, score=score, draft_init=profile.trajectory.draft_init,
    )  # fmt: skip

    state = resume_dir
    if state is not None:
        inputs = {"train": [list(p) for p in train], "held_out": [list(p) for p in held_out], "block_size": n,
                  "max_new_tokens": max_new_tokens, "measure_trained": measure_trained, "model_dir": model_dir,
                  "trajectory": profile.trajectory.model_dump(mode="json")}  # fmt: skip
        _same_or_new(state / "inputs.json", inputs, "the questions, tokens, model or trajectory settings")
    base, records = _read_base(state)
    if base is None:
        collect = collect_batch_size or batch_size
        base, records = _base_row(profile, model_dir, train, measured, device, max_new_tokens, collect)
        _write_base(state, base, records)
    rows = [base]
    emit = on_row or (lambda _row: None)
    emit(base)

    scratch = state if state is not None else Path(tempfile.mkdtemp(prefix="jf-mechanism-", dir=workdir))
    try:
        for name, overrides in variants.items():
            where = scratch / name
            if state is not None:
                _same_or_new(where / "overrides.json", overrides, f"variant {name!r}'s overrides")
            if (where / ROW).exists():
                row = _read_row(where / ROW)
            else:
                trained = _train_variant(
                    variant_profile(profile, overrides), model_dir, records, where, progress, device
                )
                row = _variant_row(name, overrides, where, trained, measured, base, device)
                _keep_or_drop(where, name, row, keep=keep, state=state)
            rows.append(row)
            emit(row)
    finally:
        if state is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return rows


def _base_row(
    profile: Profile, model_dir: str, train, measured: Callable, device: str, max_new_tokens: int, batch_size: int
) -> tuple[MechanismRow, list[dict]]:
    """The base model measured, then its trajectories on the trained questions collected."""
    model, tok = load_model(model_dir, dtype="float32", device=device)
    base = MechanismRow("base", {}, *measured(model, stop_tokens(model, tok), (None, None)))
    return _collect(profile, model, tok, train, base, max_new_tokens, batch_size)


def _measure_sets(model, stop: StopTokens, base_outputs: tuple, *, sets: tuple, **common) -> tuple[SetFigures, ...]:
    """The model's figures on the trained questions and on the held-out ones, each against the base's outputs
    (None for the base itself)."""
    return tuple(
        measure(model, stop, prompts, base_outputs=outputs, references=refs, **common)
        for (prompts, refs), outputs in zip(sets, base_outputs, strict=True)
    )


def _variant_row(
    name: str, overrides: dict, where: Path, trained: tuple, measured: Callable, base: MechanismRow, device: str
) -> MechanismRow:
    """A trained variant measured as the base was: its model from `where/model`, the training's figures beside."""
    seconds, tokens, history = trained
    model, tok = load_model(str(where / "model"), dtype="float32", device=device)
    figures = measured(model, stop_tokens(model, tok), (base.trained.outputs, base.held_out.outputs))
    final = {k: v for k, v in (history or [{}])[-1].items() if isinstance(v, float)}
    row = MechanismRow(name, overrides, *figures, seconds, tokens, final)
    row.history = history
    return row


def _keep_or_drop(where: Path, name: str, row: MechanismRow, *, keep: Path | None, state: Path | None) -> None:
    """After a variant is measured: its model moved to `keep/<name>` when asked; with a resumable state, its row
    written and the weights it no longer needs dropped (540 MB a SmolLM2 copy); else its directory removed."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        # Across file systems a move is a copy: under a temporary name, renamed once whole.
        partial_copy = shutil.move(where / "model", keep / f".{name}.partial")
        Path(partial_copy).rename(keep / name)
    if state is not None:
        write_json_atomic(where / ROW, asdict(row))
        shutil.rmtree(where / "model", ignore_errors=True)
        shutil.rmtree(where / "checkpoints", ignore_errors=True)
    else:
        shutil.rmtree(where, ignore_errors=True)


ROW = "row.json"


def _collect(profile: Profile, model, tok, train, base: MechanismRow, max_new_tokens: int, batch_size: int):
    """The base model's trajectories of the `train` questions, with the profile's trajectory settings (kind
    included): (the base row with what they cost, the records)."""
    from jf_core.trajectory.collect import CollectConfig, collect
    from jf_core.trajectory.prompts import PromptItem

    items = [PromptItem(prompt_id=f"q{i}", token_ids=list(p)) for i, p in enumerate(train)]
    collect_cfg = CollectConfig(
        block_size=profile.trajectory.block_size,
        max_new_tokens=max_new_tokens,
        seed=profile.trajectory.seed,
        batch_size=batch_size,
        draft_init=profile.trajectory.draft_init,
        kind=profile.trajectory.kind,
        corruption=profile.trajectory.corruption,
    )
    collected = collect(model, tok, items, collect_cfg, model_hash="mechanism")
    base.trajectories = {
        "kind": collect_cfg.kind,
        "blocks": len(collected.records),
        "tokens": collected.new_tokens,
        "seconds": collected.seconds,
        "tokens_per_s": collected.new_tokens / max(collected.seconds, 1e-9),
    }
    return base, collected.records


def _same_or_new(path: Path, value, what: str) -> None:
    """Record `value` at `path`, or refuse to resume a run that was started with another one: a rerun must go on
    with the questions and settings its saved rows and checkpoints were made with."""
    if path.exists():
        if json.loads(path.read_text()) != json.loads(json.dumps(value)):
            raise ValueError(
                f"{path.parent}: resuming a run started with other {what} ({path.name} differs); "
                "rerun with the same arguments or another resume directory"
            )
        return
    write_json_atomic(path, value)


def _read_row(path: Path) -> MechanismRow:
    saved = json.loads(path.read_text())
    return MechanismRow(
        **{**saved, "trained": SetFigures(**saved["trained"]), "held_out": SetFigures(**saved["held_out"])}
    )


def _write_base(state: Path | None, base: MechanismRow, records: list[dict]) -> None:
    if state is None:
        return
    import pyarrow as pa

    write_parquet_atomic(state / "trajectories.parquet", pa.Table.from_pylist(records))
    write_json_atomic(state / "base.json", asdict(base))  # last: its presence says both are whole


def _read_base(state: Path | None) -> tuple[MechanismRow | None, list[dict]]:
    if state is None or not (state / "base.json").exists():
        return None, []
    import pyarrow.parquet as pq

    return _read_row(state / "base.json"), pq.read_table(state / "trajectories.parquet").to_pylist()


def train_on_records(
    profile: Profile, model_dir: str, records: list[dict], where: Path, *, device: str, progress: bool = False, **kw
) -> tuple[TrainSummary, list]:
    """Pack trajectory `records` with the profile's noise schedule and train `model_dir` on them through the round's
    driver (`train_round`), in `where` (its packed Parquet, checkpoints and `model/`): (training's summary, the
    packed examples). The one path the benches train by (`**kw`: train_round's, e.g. `log_every`). Where `where`
    already holds packed examples (a run that died), they are trained on again and the checkpoints resume."""
    import pyarrow as pa

    from jf_core.round.training import train_round
    from jf_core.training.jf_data import read_packed_share
    from jf_core.training.packing import pack_records

    t = profile.training
    examples = where / "examples.parquet"
    if examples.exists():  # a resumed run: its checkpoints were trained on these examples, in this order
        packed = read_packed_share(examples, 0, 1)
    else:
        packed, _ = pack_records(records, NoiseSchedule.of(t), t.max_length)
        write_parquet_atomic(examples, pa.Table.from_pylist([asdict(e) for e in packed]))
    summary = train_round(
        profile, model_dir, where / "examples.parquet", where / "checkpoints", where / "model",
        device=torch.device(device), progress=progress, **kw,
    )  # fmt: skip
    return summary, packed


def _train_variant(
    profile: Profile, model_dir: str, records: list[dict], where: Path, progress: bool, device: str
) -> tuple[float, int, list[dict]]:
    """Pack and train one variant: (seconds, about how many packed tokens it trained on, training's logged rows)."""
    t = profile.training
    start = time.perf_counter()
    summary, packed = train_on_records(profile, model_dir, records, where, device=device, progress=progress)
    seconds = time.perf_counter() - start + _seconds_before(summary.history, summary.resumed_from_step)
    per_example = sum(e.total_length for e in packed) / len(packed)
    tokens = int(per_example * t.steps * t.batch_size * t.grad_accum)
    return seconds, tokens, summary.history


def _seconds_before(history: list[dict], resumed_from: int) -> float:
    """About how long the processes before a resumed one trained: each one's last logged `elapsed_s` (which
    counts from its own start) before the checkpoint it was resumed from; 0 for a run that was not resumed."""
    total, last = 0.0, 0.0
    for row in history:
        if row["step"] >= resumed_from or "elapsed_s" not in row:
            continue
        if row["elapsed_s"] < last:  # a new process began here
            total += last
        last = row["elapsed_s"]
    return total + last


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: Sequence[MechanismRow]) -> str:
    """The rows as a Markdown table: TPF before/after beside identity and repetition, for both question sets."""
    head = [
        "variant",
        "TPF trained",
        "TPF held-out",
        "= own AR (trained / held-out)",
        "= base text (trained / held-out; median tokens kept)",
        "repetition (trained / held-out)",
        "accuracy (trained / held-out)",
        "train s",
        "train tokens",
    ]
    cells = [
        [
            r.variant,
            f"{r.trained.tpf:.3f}",
            f"{r.held_out.tpf:.3f}",
            f"{r.trained.identical_to_own_ar:.2f} / {r.held_out.identical_to_own_ar:.2f}",
            f"{r.trained.identical_to_base:.2f} / {r.held_out.identical_to_base:.2f} "
            f"({r.trained.base_prefix:.0f} / {r.held_out.base_prefix:.0f})",
            f"{r.trained.repetition:.3f} / {r.held_out.repetition:.3f}",
            f"{_share(r.trained.accuracy)} / {_share(r.held_out.accuracy)}",
            f"{r.train_seconds:.0f}",
            str(r.train_tokens),
        ]
        for r in rows
    ]
    return markdown(head, cells)
