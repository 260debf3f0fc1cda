"""The embedded default model: shipped with the package (`embedded_model`), and made from scratch by `jf bootstrap`
(an ordinary AR model trained on the embedded task, cached).

The package carries the weights `jf bootstrap` made with the default recipe on 2 threads (`jf_core/toy/embedded/`,
3 MB), so every machine's round starts from the same base and no run waits minutes for it. A bootstrap's cache key
hashes everything that determines its result (task, model and training configs, seed, threads), so a changed recipe
trains a new model instead of silently reusing a stale one."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from jf_core.atomic import atomic_dir
from jf_core.checksums import MANIFEST, verify
from jf_core.decoding import StopTokens, ar_decode
from jf_core.model_dir import save_checkpoint
from jf_core.paths import jf_home
from jf_core.threads import ThreadGovernor, ThreadRecord, cpu_budget
from jf_core.toy.data import ar_batches
from jf_core.toy.evaluate import evaluate
from jf_core.toy.model import ToyModelConfig, build_model
from jf_core.toy.task import ToyTaskConfig, make_split
from jf_core.toy.tokenizer import build_tokenizer
from jf_core.training.trainer import TrainConfig, causal_lm_loss, train

RECIPE_VERSION = 2  # bump when code changes what a given config trains or saves (2: the tokenizer's chat template)
REPORT = "bootstrap.json"  # how the model was made (BootstrapReport), beside its weights
# The embedded model as the package ships it: `jf bootstrap`'s output for BootstrapConfig(threads=2), copied here.
SHIPPED_DIR = Path(__file__).with_name("embedded")


@dataclass(frozen=True)
class BootstrapConfig:
    task: ToyTaskConfig = field(default_factory=ToyTaskConfig)
    model: ToyModelConfig = field(default_factory=ToyModelConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=2700, lr=3e-3, warmup_steps=50, log_every=100))
    train_size: int = 60_000
    test_size: int = 500
    batch_size: int = 32
    seed: int = 0
    # torch CPU threads for training, kept for the whole run. None: every CPU this process may use. Part of the key:
    # threads split a gradient's sums, so 1 and 2 threads train models that differ in their last bits.
    threads: int | None = None

    def train_threads(self) -> int:
        return self.threads or cpu_budget()

    def key(self) -> str:
        fields = {**asdict(self), "threads": self.train_threads()}
        blob = json.dumps({"recipe": RECIPE_VERSION, **fields}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def embedded_model_dir(cfg: BootstrapConfig | None = None, home: Path | None = None) -> Path:
    cfg = cfg or BootstrapConfig()
    return (home or jf_home()) / "models" / f"embedded-qwen2-{cfg.key()}"


class BootstrapReport(BaseModel):
    """How the embedded model was made: its `bootstrap.json`, written beside its weights and read back as this."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    accuracy: float  # greedy, exact match on the test split
    test_size: int
    train_seconds: float
    total_seconds: float
    parameters: int
    final_loss: float
    threads: ThreadRecord
    config: dict[str, Any]  # the BootstrapConfig it was trained with
    loss_curve: list[tuple[int, float]]

    @classmethod
    def read(cls, model_dir: str | Path) -> BootstrapReport:
        return cls.model_validate_json((Path(model_dir) / REPORT).read_text())


def embedded_model(home: Path | None = None) -> Path:
    """The embedded default's directory: the shipped weights, copied once under $JF_HOME/models (commands write into
    a model directory, `jf tune` its config, so the package's own copy stays as shipped). The copy is named by the
    weights' checksum, so a package carrying other weights gets a directory of its own."""
    sums = SHIPPED_DIR / MANIFEST
    if not sums.is_file():
        raise FileNotFoundError(f"{sums}: the embedded model's weights are missing from this installation")
    digest = hashlib.sha256(sums.read_bytes()).hexdigest()[:12]
    out = (home or jf_home()) / "models" / f"embedded-qwen2-shipped-{digest}"

    def copy() -> None:
        verify(SHIPPED_DIR)  # a damaged installation is refused naming the file, never copied on
        with atomic_dir(out) as tmp:
            shutil.copytree(SHIPPED_DIR, tmp, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)

    return _made_once(out, copy)


def ensure_embedded_model(
    cfg: BootstrapConfig | None = None,
    home: Path | None = None,
    progress: bool = True,
    on_log: Callable[[int, dict], None] | None = None,
) -> Path:
    """The cached embedded model's directory; bootstraps it first when it is not there (`on_log(step, row)`: the
    training's logged rows, for a caller whose terminal bar nobody sees, such as a flow's task)."""
    out = embedded_model_dir(cfg, home)
    say = print if progress else None
    return _made_once(out, lambda: bootstrap(cfg or BootstrapConfig(), out, progress=progress, on_log=on_log), say)


def _made_once(out: Path, make: Callable[[], object], say: Callable[[str], None] | None = None) -> Path:
    """`out`, made by `make` unless its report is there; one maker at a time on a machine (`exclusive`), and a
    process that waited for another finds its model and makes nothing."""
    if not (out / REPORT).is_file():
        with exclusive(out, say=say):
            if not (out / REPORT).is_file():
                make()
    return out


@contextlib.contextmanager
def exclusive(out: Path, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """One bootstrap of a model at a time on a machine: a second process that needs it (a test session beside a
    warm-up, two `jf run`s on an empty $JF_HOME) waits for the first and reuses its model instead of training the same
    one again. An advisory lock on a file beside the model's directory, released when its holder ends, however."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if say:
                say(f"waiting for another process's bootstrap of {out}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def bootstrap(
    cfg: BootstrapConfig, out: Path, progress: bool = True, on_log: Callable[[int, dict], None] | None = None
) -> BootstrapReport:
    """Train, evaluate (greedy, exact match on the test split) and save atomically; return the report."""
    torch.manual_seed(cfg.seed)
    tokenizer = build_tokenizer()
    model = build_model(cfg.model, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, cfg.seed)
    train_set = make_split("train", cfg.train_size, cfg.task)
    test_set = make_split("test", cfg.test_size, cfg.task)
    started = time.perf_counter()
    result = train(
        model,
        ar_batches(tokenizer, train_set, cfg.batch_size, cfg.seed),
        causal_lm_loss,
        cfg.train,
        progress=progress,
        on_log=on_log,
        # one count throughout: the embedded model must not follow the machine's load
        threads=ThreadGovernor.for_training(cfg.train_threads()),
    )
    model.eval()

    def decode(prompts):
        return ar_decode(
            model, prompts, max_new_tokens=160, stop=StopTokens(tokenizer.eos_token_id, tokenizer.pad_token_id)
        )

    evaluation = evaluate(tokenizer, test_set, decode, batch_size=64)
    report = BootstrapReport(
        key=cfg.key(),
        accuracy=evaluation.accuracy,
        test_size=evaluation.total,
        train_seconds=result.train_seconds,
        total_seconds=time.perf_counter() - started,
        parameters=sum(p.numel() for p in model.parameters()),
        final_loss=result.history[-1]["loss"],
        threads=result.threads,
        # JSON's view of the config (a torch dtype as its name), as the file has always held it
        config=json.loads(json.dumps({**asdict(cfg), "threads": cfg.train_threads()}, default=str)),
        loss_curve=[(int(r["step"]), r["loss"]) for r in result.history],
    )
    save_checkpoint(model, out, tokenizer=tokenizer, extra_files={REPORT: report.model_dump_json(indent=2)})
    return report
