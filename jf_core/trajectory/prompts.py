"""Prompt sources for trajectory collection.

A source is a JSONL (optionally .gz) or Parquet file, a store made by `jf prompts prepare` (its `train` and `calib`
splits), a directory saved with `datasets.save_to_disk`, a hub dataset id, or `embedded` (the embedded task's
splits). Rows give either a text field or chat messages; the
tokenizer's chat template is applied when it has one (configurable). Text is used exactly as stored: whitespace is
never collapsed (upstream's bucketing destroys code indentation that way).

Rows that cannot be used are skipped and counted by reason (missing field, empty, too long); a file that cannot be
parsed is an error naming the file and line.

Why over 350 lines: every prompt source (JSONL, Parquet, a datasets directory, the embedded task, extra files),
its hash splits, number variants and reference answers read through one path, so training, calibration and
evaluation see the same prompts under the same ids.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from jf_core.trajectory.prompt_source import HeldOutSlice, PromptSourceConfig, held_out_whole


class PromptSourceError(ValueError):
    pass


def hash_split(text: str, fractions: dict[str, float]) -> str:
    """The split a row's text falls in: its sha256 as a number in [0, 1) against the cumulative fractions."""
    point = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64
    total = 0.0
    for name, fraction in fractions.items():
        total += fraction
        if point < total:
            return name
    return name  # rounding at the very top


def held_out_slice(text: str) -> HeldOutSlice:
    """The half of the held-out questions a question's text falls in (prompt_source.HeldOutSlice): its sha256 under
    a salt of its own, so the halves cut across any hash split of the same file (the profile's `test` split is one
    range of the unsalted hash) and across any file's order."""
    point = int.from_bytes(hashlib.sha256(f"held-out slice\n{text}".encode()).digest()[:8], "big") / 2**64
    return "development" if point < 0.5 else "confirmation"


NUMBER = re.compile(r"\d+")


def number_variant(text: str, rng: random.Random) -> str:
    """`text` with each distinct run of digits replaced by another of as many digits, the same replacement wherever
    it recurs ("3 sprints 3 times, 60 meters" -> "7 sprints 7 times, 48 meters"); a run with a leading zero stays."""
    swapped: dict[str, str] = {}

    def swap(match: re.Match) -> str:
        digits = match.group(0)
        if digits not in swapped:
            n = len(digits)
            swapped[digits] = digits if digits[0] == "0" and n > 1 else str(rng.randint(10 ** (n - 1), 10**n - 1))
        return swapped[digits]

    return NUMBER.sub(swap, text)


def split_key(row: dict, cfg: PromptSourceConfig) -> str:
    """What a row is split by: its text, or its chat messages as JSON."""
    if cfg.messages_field is not None:
        return json.dumps(row.get(cfg.messages_field), sort_keys=True)
    return str(row.get(cfg.text_field, ""))


@dataclass(frozen=True)
class PromptItem:
    prompt_id: str
    token_ids: list[int]
    answer: str | None = None  # the row's reference answer, where `answer_field` names it


@dataclass
class PromptSet:
    items: list[PromptItem]
    skipped: Counter = field(default_factory=Counter)

    def summary(self) -> dict:
        return {"prompts": len(self.items), "skipped": dict(self.skipped)}


def _read_jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise PromptSourceError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
            if not isinstance(row, dict):
                raise PromptSourceError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield str(lineno - 1), row


def _read_parquet(path: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise PromptSourceError(f"{path}: cannot read as Parquet ({err})") from err
    for i, row in enumerate(table.to_pylist()):
        yield str(i), row


def _read_datasets(source: str, split: str) -> Iterator[tuple[str, dict]]:
    import datasets

    path = Path(source)
    if path.is_dir():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise PromptSourceError(f"{path}: no split {split!r} (has {sorted(ds)})")
            ds = ds[split]
    else:
        ds = datasets.load_dataset(source, split=split)
    for i, row in enumerate(ds):
        yield str(i), row


def read_rows(cfg: PromptSourceConfig) -> Iterator[tuple[str, dict]]:
    """The source's rows as (row id, row); with `hash_splits`, only those of `split`; in `train`, each followed by
    its `number_variants` (ids `<row id>~1`, `~2`, ...; the row holds the rewritten text and `variant_of`)."""
    for row_id, row in _split_rows(cfg):
        yield row_id, row
        if cfg.number_variants and cfg.split == "train":
            text = str(row.get(cfg.text_field, ""))
            rng = random.Random(f"{row_id}\n{text}")  # str seeds are hashed with sha512: the same on every machine
            for k in range(1, cfg.number_variants + 1):
                yield f"{row_id}~{k}", {cfg.text_field: number_variant(text, rng), "variant_of": row_id}


def _split_rows(cfg: PromptSourceConfig) -> Iterator[tuple[str, dict]]:
    rows = _read_source(cfg)
    if cfg.source == "embedded":  # its splits are disjoint by construction (the held-out halves too)
        yield from rows
        return
    if cfg.hash_splits and cfg.split not in cfg.hash_splits:
        raise PromptSourceError(
            f"{cfg.source}: split {cfg.split!r} is not one of hash_splits {sorted(cfg.hash_splits)}"
        )
    for row_id, row in rows:
        key = split_key(row, cfg)
        if cfg.hash_splits and hash_split(key, cfg.hash_splits) != cfg.split:
            continue
        if cfg.held_out_slice and held_out_slice(key) != cfg.held_out_slice:
            continue
        yield row_id, row


def _read_source(cfg: PromptSourceConfig) -> Iterator[tuple[str, dict]]:
    if cfg.source == "embedded":
        from jf_core.toy.task import make_split

        for example in make_split(cfg.split, cfg.limit or 1000):
            yield example.uid, {cfg.text_field: example.prompt}
        return
    path = Path(cfg.source).expanduser()
    name = path.name.lower()
    if path.is_dir() and (path / "manifest.json").is_file():  # a store made by `jf prompts prepare`
        split = path / f"{cfg.split}.jsonl"
        if not split.is_file():
            raise PromptSourceError(f"{path}: no split {cfg.split!r} (a prepared store has train and calib)")
        yield from _read_jsonl(split)
    elif name.endswith((".jsonl", ".jsonl.gz", ".json.gz")):
        if not path.is_file():
            raise PromptSourceError(f"prompt file {path} does not exist")
        yield from _read_jsonl(path)
    elif name.endswith(".parquet"):
        if not path.is_file():
            raise PromptSourceError(f"prompt file {path} does not exist")
        yield from _read_parquet(path)
    else:
        yield from _read_datasets(cfg.source, cfg.split)


@dataclass(frozen=True)
class PromptFormat:
    """How a text becomes a model input: the profile's chat-template switch and system prompt."""

    chat_template: bool | None = None  # None: apply when the tokenizer has one
    system_prompt: str | None = None

    @classmethod
    def of(cls, source: PromptSourceConfig) -> PromptFormat:
        return cls(source.chat_template, source.system_prompt)

    def render(self, content: str | list[dict], tokenizer) -> str:
        return format_prompt(content, tokenizer, chat_template=self.chat_template, system_prompt=self.system_prompt)


def uses_chat_template(tokenizer, chat_template: bool | None) -> bool:
    return chat_template if chat_template is not None else bool(getattr(tokenizer, "chat_template", None))


def format_prompt(
    content: str | list[dict], tokenizer, *, chat_template: bool | None = None, system_prompt: str | None = None
) -> str:
    """The model's input for a user text (or a list of chat messages): the chat template with the generation
    prompt and the system prompt when the template is used, else the text as is. Trajectory prompts and evaluation
    prompts both come from here, so a model is evaluated on prompts shaped like the ones it was trained on."""
    if not uses_chat_template(tokenizer, chat_template):
        if not isinstance(content, str):
            raise PromptSourceError("chat messages need a tokenizer with a chat template")
        return content
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else list(content)
    if system_prompt is not None:
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _render(cfg: PromptSourceConfig, row: dict, tokenizer) -> tuple[str | None, str | None]:
    """(text to tokenize, skip reason)."""
    use_template = uses_chat_template(tokenizer, cfg.chat_template)
    if cfg.messages_field is not None:
        messages = row.get(cfg.messages_field)
        if not isinstance(messages, list) or not messages:
            return None, f"missing_field:{cfg.messages_field}"
        if not use_template:
            raise PromptSourceError(f"messages_field {cfg.messages_field!r} needs a tokenizer with a chat template")
        if all(not str(m.get("content", "")).strip() for m in messages):
            return None, "empty"
    else:
        text = row.get(cfg.text_field)
        if not isinstance(text, str):
            return None, f"missing_field:{cfg.text_field}"
        if not text.strip():
            return None, "empty"
        messages = text
    return format_prompt(messages, tokenizer, chat_template=cfg.chat_template, system_prompt=cfg.system_prompt), None


def held_out_source(
    prompts: PromptSourceConfig, source: str | None, split: str | None, part: HeldOutSlice
) -> PromptSourceConfig:
    """Where held-out questions come from, rendered like the training prompts: the `part` half (development for a
    decision, confirmation for a reported figure: prompt_source.HeldOutSlice) of `source` whole (`held_out_whole`),
    else of the prompt file's held-out hash `split` (default test); the embedded task's calib or test split.
    `source` and `split` are the evaluation's."""
    if prompts.source == "embedded" and not held_out_whole(prompts, source):
        return prompts.model_copy(update={"split": "calib" if part == "development" else split or "test"})
    if held_out_whole(prompts, source):
        update = {"source": source, "hash_splits": None, "number_variants": 0}
        return prompts.model_copy(update={**update, "held_out_slice": part})
    return prompts.model_copy(update={"split": split or "test", "held_out_slice": part})


def calibration_prompts(source: PromptSourceConfig, tokenizer, n: int, split: str | None = None) -> list[list[int]]:
    """`n` calibration prompts (choosing n, autotuning) from the profile's prompt source, rendered like its training
    prompts: the `split` ("calib" for the embedded task, whose splits are disjoint; a file source has none and
    gives its first prompts)."""
    split = split or ("calib" if source.source == "embedded" or source.hash_splits else source.split)
    return [p.token_ids for p in load_prompts(source.model_copy(update={"split": split, "limit": n}), tokenizer).items]


def usable_rows(
    cfg: PromptSourceConfig,
    rows,
    tokenizer,
    skipped: Counter,
    context_length: int | None = None,
    max_new_tokens: int = 0,
):
    """(row id, row, rendered text, token ids) for the first `cfg.limit` rows that render and whose length is within
    [min_prompt_tokens, max_prompt_tokens] (and, with `context_length`, leaves room for `max_new_tokens`); every
    other row read is counted in `skipped` by reason."""
    for read, (row_id, row) in enumerate(rows):
        if cfg.limit is not None and read >= cfg.limit:
            return
        text, reason = _render(cfg, row, tokenizer)
        if text is None:
            skipped[reason] += 1
            continue
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < cfg.min_prompt_tokens:
            skipped["too_short"] += 1
            continue
        too_long = cfg.max_prompt_tokens is not None and len(ids) > cfg.max_prompt_tokens
        if too_long or (context_length is not None and len(ids) + max_new_tokens > context_length):
            skipped["too_long"] += 1
            continue
        yield row_id, row, text, ids


def rows_by_prompt_id(cfg: PromptSourceConfig) -> dict[str, dict]:
    """The source's rows (of its split) by the prompt id `load_prompts` gives their prompts: what a prompt's answer
    is scored against. The main source only (`extra_sources` have no references)."""
    return {str(row[cfg.id_field]) if cfg.id_field and cfg.id_field in row else row_id: row
            for row_id, row in read_rows(cfg)}  # fmt: skip


def load_prompts(
    cfg: PromptSourceConfig, tokenizer, *, context_length: int | None = None, max_new_tokens: int = 0
) -> PromptSet:
    """Tokenize the source's prompts, skipping (and counting) the unusable, sorted by length so that batches and
    shards hold prompts of similar lengths. A prompt whose tokens plus `max_new_tokens` exceed `context_length` is
    skipped as too long."""
    items: list[PromptItem] = []
    skipped: Counter = Counter()
    sources = [(cfg, "")]
    for extra in cfg.extra_sources:
        sources.append((cfg.model_copy(update={"source": extra, "limit": None, "extra_sources": []}), Path(extra).name))
    for source, prefix in sources:
        usable = usable_rows(source, read_rows(source), tokenizer, skipped, context_length, max_new_tokens)
        for row_id, row, _, ids in usable:
            prompt_id = str(row[cfg.id_field]) if cfg.id_field and cfg.id_field in row else row_id
            answer = row.get(cfg.answer_field) if cfg.answer_field else None
            if cfg.answer_field and (not isinstance(answer, str) or not answer.strip()):
                skipped["no_answer"] += 1
                continue
            item_id = f"{prefix}/{prompt_id}" if prefix else prompt_id
            items.append(PromptItem(prompt_id=item_id, token_ids=ids, answer=answer))
    ids_seen = [i.prompt_id for i in items]
    if len(set(ids_seen)) != len(ids_seen):
        raise PromptSourceError(f"{cfg.source}: prompt ids are not unique (id_field={cfg.id_field!r})")
    items.sort(key=lambda item: len(item.token_ids))
    return PromptSet(items=items, skipped=skipped)
