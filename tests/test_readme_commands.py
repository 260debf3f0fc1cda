"""The READMEs' commands and snippets hold as written: every `jf` command line in a code block parses with the real
CLI (an option renamed or a choice dropped fails here), every Python snippet compiles, every embedded-task prompt
shown is one the task makes (so the model solves it), and the `jf decode` examples run as written on the embedded
model: greedy gives the task's answer, and at the sampling example's temperature seeds give different texts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "infra/README.md")
# Placeholders the READMEs write for what the reader supplies, and a value of the right kind for each.
PLACEHOLDERS = {
    "DIR": "/tmp/model",
    "PATH/gsm8k_test.jsonl": "/tmp/gsm8k_test.jsonl",
    "PATH": "/tmp/model",
    "P": "tiny",
    "NAME": "cllm",
    "<OpenCodeInstruct JSONL or hub id>": "/tmp/prompts.jsonl",
}


def _blocks(lang: str) -> list[tuple[str, str]]:
    """(readme, body) of every fenced block in `lang`."""
    out = []
    for name in READMES:
        text = (ROOT / name).read_text()
        out += [(name, body) for tag, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S) if tag == lang]
    return out


def _command_lines(body: str) -> list[str]:
    """Shell lines of a block with continuations joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line.split(" #", 1)[0].strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def jf_commands() -> list[tuple[str, list[str]]]:
    """(the line as written, its argv after `jf`) for every `jf` invocation in the READMEs; `[...]` marks an optional
    part, left out, and placeholders get a value of their kind."""
    out = []
    for _readme, body in _blocks("bash"):
        for line in _command_lines(body):
            concrete = re.sub(r"\s*\[[^\]]*\]", "", line)
            for placeholder, value in PLACEHOLDERS.items():
                concrete = re.sub(rf"(?<![\w/]){re.escape(placeholder)}(?![\w/])", value, concrete)
            lexer = shlex.shlex(concrete, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            words: list[str] = []
            for token in [*lexer, ";"]:  # commands end at ; && || |
                if token.strip(";&|"):
                    words.append(token)
                    continue
                if words and re.fullmatch(r"(\.venv/bin/)?jf", words[0]):
                    out.append((line, words[1:]))
                words = []
    return out


def test_every_jf_command_in_the_readmes_parses():
    from jf_cli.main import build_parser

    commands = jf_commands()
    assert len(commands) >= 30, commands  # the extraction found the commands (README.md alone shows 29)
    parser = build_parser()
    for line, argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit as exit_:
            pytest.fail(f"README command does not parse (exit {exit_.code}): {line}")


def test_every_python_snippet_compiles():
    snippets = _blocks("python")
    assert len(snippets) >= 2
    for readme, body in snippets:
        compile(body, readme, "exec")


def test_every_embedded_task_prompt_shown_is_one_the_task_makes():
    """`program: a=3; return a` is not a program of the task: the model answered it with garbage."""
    from jf_core.toy.task import example_of

    prompts = [p for _, body in _blocks("bash") + _blocks("python") for p in re.findall(r"program: [^\"']+", body)]
    assert len(prompts) >= 6, prompts
    assert [p for p in prompts if example_of(p) is None] == []


def _decode_lines() -> list[list[str]]:
    return [argv for _, argv in jf_commands() if argv[0] == "decode" and "--model" not in argv]


def test_the_decode_examples_run_as_written_on_the_embedded_model(embedded, capsys):
    """The greedy example prints the task's answer; the sampling example's temperature is one where seeds show."""
    from jf_cli.main import main
    from jf_core.toy.task import example_of

    greedy, sampled = _decode_lines()
    assert "--temperature" not in greedy and "--temperature" in sampled
    assert main(greedy) == 0
    answer = example_of(greedy[greedy.index("--prompt") + 1]).answer
    assert answer in capsys.readouterr().out

    texts = []
    for seed in ("3", "4", "5"):
        argv = [*sampled[: sampled.index("--seed")], "--seed", seed]
        assert main(argv) == 0
        texts.append(capsys.readouterr().out.split("\n[", 1)[0])
    assert len(set(texts)) > 1, texts  # a reader trying seeds sees them change the text


def test_the_commands_that_need_no_model_or_server_run_as_written(capsys):
    """`jf ablate --list` and `jf plan` (a config on the meta device): exit 0 and print what the README says."""
    from jf_cli.main import main

    ran = [argv for _, argv in jf_commands() if argv[:2] == ["ablate", "--list"] or argv[0] == "plan"]
    assert len(ran) == 2, ran
    for argv in ran:
        assert main(argv) == 0, argv
    out = capsys.readouterr().out
    assert "cllm:" in out and "# Memory plan: qwen2.5-coder-7b" in out
