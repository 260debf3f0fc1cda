"""Accuracy benchmarks: loaders, prompt templates and scorers.

| name | source fields | scored by |
|---|---|---|
| humaneval | task_id, prompt, test, entry_point | running prompt + completion + test + check() in the sandbox |
| mbpp | task_id, text, test_list, test_setup_code | running completion + setup + asserts in the sandbox |
| gsm8k | question, answer | the final number (answers.extract_gsm8k) |
| math | problem, and answer (MATH-500) or solution (MATH) | the last boxed answer, normalised (answers.math_correct) |
| embedded | (generated) | exact match of the embedded task's answer |

A source is a local file (JSONL, JSONL.gz, Parquet) or a hub id (through `datasets`, with the benchmark's usual
config and split); templates are configurable per model (`{prompt}`, `{question}`, `{problem}`, `{text}`,
`{tests}` placeholders).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jf_core.evaluation.answers import gsm8k_correct, math_correct
from jf_core.evaluation.sandbox import SandboxLimits, run_program
from jf_core.trajectory import prompts
from jf_core.trajectory.prompt_source import HeldOutSlice


@dataclass(frozen=True)
class BenchmarkSpec:
    name: str
    hub_id: str | None
    hub_config: str | None
    split: str
    required: tuple[str, ...]
    template: str
    kind: str  # code | answer | embedded
    key: str = "prompt"  # the field a row's held-out half is hashed by (prompts.held_out_slice): its question


SPECS = {
    "humaneval": BenchmarkSpec(
        "humaneval", "openai/openai_humaneval", None, "test", ("task_id", "prompt", "test", "entry_point"), "{prompt}",
        "code",
    ),
    "mbpp": BenchmarkSpec(
        "mbpp", "google-research-datasets/mbpp", "full", "test", ("task_id", "text", "test_list"),
        '"""\n{text}\nYour code should pass these tests:\n{tests}\n"""\n', "code", "text",
    ),
    "gsm8k": BenchmarkSpec(
        "gsm8k", "openai/gsm8k", "main", "test", ("question", "answer"), "Question: {question}\nAnswer:", "answer",
        "question",
    ),
    "math": BenchmarkSpec(  # MATH-500 (Lightman et al.'s subset): one config, an `answer` field; the full MATH
        # (EleutherAI/hendrycks_math) needs a subject config: give a local file or a dataset directory instead.
        "math", "HuggingFaceH4/MATH-500", None, "test", ("problem",),
        "Problem: {problem}\nPut the final answer in \\boxed{{}}.\nSolution:", "answer", "problem",
    ),
    "embedded": BenchmarkSpec("embedded", None, None, "test", (), "{prompt}", "embedded"),
}  # fmt: skip


@dataclass(frozen=True)
class BenchmarkItem:
    uid: str
    prompt: str  # the model's input, after the template
    record: dict = field(default_factory=dict, hash=False)  # the source row, for the scorer


class BenchmarkError(ValueError):
    pass


def read_records(source: str, spec: BenchmarkSpec) -> list[dict]:
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        opener = gzip.open if path.suffix == ".gz" else open
        rows = []
        with opener(path, "rt", encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise BenchmarkError(f"{path}:{i}: not JSON ({err})") from err
        return rows
    if path.suffix in (".jsonl", ".gz", ".parquet", ".json") or "/" not in source:
        raise BenchmarkError(f"benchmark file {path} does not exist")
    import datasets

    return list(datasets.load_dataset(source, spec.hub_config, split=spec.split))


def load_benchmark(
    name: str,
    source: str | None = None,
    *,
    limit: int | None = None,
    template: str | None = None,
    keep: Callable[[dict], bool] | None = None,
    held_out_slice: HeldOutSlice | None = None,
    key: str | None = None,
) -> list[BenchmarkItem]:
    """The benchmark's first `limit` items (of the rows `keep` accepts: a held-out hash split, for one), of the
    `held_out_slice` half where one is named (by each row's `key` field, default the benchmark's question field;
    the embedded task's calib or test split)."""
    if name not in SPECS:
        raise BenchmarkError(f"unknown benchmark {name!r}; known: {', '.join(sorted(SPECS))}")
    spec = SPECS[name]
    template = template or spec.template
    if spec.kind == "embedded":
        from jf_core.toy.task import make_split

        return [
            BenchmarkItem(e.uid, template.format(prompt=e.prompt), {"answer": e.answer})
            for e in make_split("calib" if held_out_slice == "development" else "test", limit or 200)
        ]
    source = source or spec.hub_id
    rows = read_records(source, spec)
    if keep is not None:
        rows = [row for row in rows if keep(row)]
    if held_out_slice is not None:
        rows = [row for row in rows if prompts.held_out_slice(str(row.get(key or spec.key, ""))) == held_out_slice]
    rows = rows[: limit or None]
    items = []
    for i, row in enumerate(rows):
        missing = [f for f in spec.required if f not in row]
        if name == "math" and not (row.get("answer") or row.get("solution")):
            missing.append("answer or solution")
        if missing:
            raise BenchmarkError(f"{source}: row {i} lacks field(s) {', '.join(missing)} needed by {name}")
        fields = {k: v for k, v in row.items() if isinstance(v, str)}
        if name == "mbpp":
            fields["tests"] = "\n".join(row["test_list"])
        items.append(BenchmarkItem(str(row.get("task_id", i)), template.format(**fields), row))
    return items


def extract_code(completion: str) -> str:
    """A chat model's code block when it wrote one, else the completion as is."""
    blocks = re.findall(r"```(?:python|py)?\n(.*?)```", completion, re.S)
    return blocks[0] if blocks else completion


def humaneval_program(record: dict, completion: str) -> str:
    """prompt + completion; a completion that writes the whole function (chat models do) replaces only the
    prompt's target function: what precedes it in the prompt (imports, helper functions) is kept."""
    code = extract_code(completion)
    entry = record["entry_point"]
    if re.search(rf"^def {re.escape(entry)}\b", code, re.M):
        target = re.search(rf"^def {re.escape(entry)}\b", record["prompt"], re.M)
        head = record["prompt"][: target.start()] if target else ""
    else:
        head = record["prompt"]
    return f"{head}{code}\n\n{record['test']}\n\ncheck({entry})\n"


def mbpp_program(record: dict, completion: str) -> str:
    setup = record.get("test_setup_code") or ""
    return f"{extract_code(completion)}\n\n{setup}\n" + "\n".join(record["test_list"]) + "\n"


def score(name: str, item: BenchmarkItem, completion: str, limits: SandboxLimits = SandboxLimits()) -> bool:
    if name == "humaneval":
        return run_program(humaneval_program(item.record, completion), limits).passed
    if name == "mbpp":
        return run_program(mbpp_program(item.record, completion), limits).passed
    if name == "gsm8k":
        return gsm8k_correct(completion, item.record["answer"])
    if name == "math":
        reference = item.record.get("answer")
        reference = f"\\boxed{{{reference}}}" if reference else item.record.get("solution", "")
        return math_correct(completion, reference)
    if name == "embedded":
        return completion.strip() == item.record["answer"].strip()
    raise BenchmarkError(f"unknown benchmark {name!r}")


def decode_items(tokenizer, items: Sequence[BenchmarkItem], decode, batch_size: int):
    """Decode every item's prompt with `decode` (any of the project's decoders) in batches; return the texts and
    the merged decoding statistics."""
    from jf_core.decoding.common import decode_batched

    prompts = [tokenizer(i.prompt, add_special_tokens=False)["input_ids"] for i in items]
    out = decode_batched(decode, prompts, batch_size)
    return [tokenizer.decode(seq, skip_special_tokens=True) for seq in out.sequences], out.stats


def accuracy(
    name: str,
    items: Sequence[BenchmarkItem],
    completions: Sequence[str],
    on_item: Callable[[int, bool], None] | None = None,
) -> float:
    if len(items) != len(completions):
        raise ValueError(f"{len(items)} items but {len(completions)} completions")
    correct = 0
    for i, (item, text) in enumerate(zip(items, completions, strict=True)):
        ok = score(name, item, text)
        correct += ok
        if on_item is not None:
            on_item(i, ok)
    return correct / max(1, len(items))
