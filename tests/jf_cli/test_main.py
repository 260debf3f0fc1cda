"""`jf` answers bad input with exit status 2 and a message naming the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jf_cli.main import main
from tests.conftest import serving_prior
from tests.jf_core.test_models import save_tiny


def run(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    return exc.value.code, capsys.readouterr()


@pytest.fixture
def tiny_dir(tmp_path):
    save_tiny(tmp_path / "m")
    return str(tmp_path / "m")


def test_decode_prints_text_and_tpf(tiny_dir, capsys):
    assert (
        main(
            [
                "decode",
                "--model",
                tiny_dir,
                "--prompt",
                "program: a=5; step +3; return f",
                "--max-new-tokens",
                "12",
                "--block-size",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert out.out.strip()
    assert "TPF" in out.err and "[n=4]" in out.err


def test_decode_runs_ar_where_the_models_crossover_says_ar_is_faster_at_batch_1(tiny_dir, capsys):
    """A tuned model whose stored crossover sends batch 1 to AR (a CPU where no width paid) decodes with AR, the
    same text as Jacobi; an explicit --block-size still asks for Jacobi."""
    from jf_core.decoding.jacobi import JacobiConfig
    from jf_core.model_dir import save_decode_config, update_block

    argv = ["decode", "--model", tiny_dir, "--prompt", "program: a=5; step +3; return f", "--max-new-tokens", "12"]
    save_decode_config(tiny_dir, JacobiConfig(block_size=4, max_new_tokens=12))
    assert main(argv) == 0
    jacobi = capsys.readouterr()
    assert "[n=4]" in jacobi.err
    update_block(tiny_dir, **serving_prior(ar_above_batch=0).block())
    assert main(argv) == 0
    ar = capsys.readouterr()
    assert ar.out == jacobi.out and "[AR: the model's crossover at batch 1] 12 tokens in 12 forwards" in ar.err
    assert main([*argv, "--block-size", "4"]) == 0
    assert "[n=4]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--block-size", "0"], "--block-size must be >= 1"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--block-size", "x"], "--block-size must be an integer"),
        (["--temperature", "-1"], "--temperature must be >= 0, got -1.0"),
        (["--temperature", "1", "--top-p", "2"], "--top_p must be in (0, 1]"),
    ],
)
def test_bad_numbers(tiny_dir, capsys, argv, message):
    code, out = run(capsys, "decode", "--model", tiny_dir, "--prompt", "a", *argv)
    assert code == 2 and message in out.err


def test_decode_samples_reproducibly_by_seed(tiny_dir, capsys):
    texts = []
    for seed in ("3", "3", "4"):
        argv = ["decode", "--model", tiny_dir, "--prompt", "program: a=5; step +3; return f", "--max-new-tokens", "24"]
        assert main([*argv, "--temperature", "5", "--seed", seed]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] != texts[2]


def test_empty_prompt(tiny_dir, capsys):
    code, out = run(capsys, "decode", "--model", tiny_dir, "--prompt", "  ")
    assert code == 2 and "--prompt is empty" in out.err


def test_missing_model(tmp_path, capsys):
    code, out = run(capsys, "decode", "--model", str(tmp_path / "absent"), "--prompt", "a")
    assert code == 2 and "does not exist" in out.err


def test_tokenizer_without_eos(tiny_dir, capsys):
    from pathlib import Path

    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = Path(tiny_dir) / name
        if f.exists():
            data = json.loads(f.read_text())
            data.pop("eos_token", None)
            if name == "tokenizer_config.json":
                data["eos_token"] = None
            f.write_text(json.dumps(data))
    code, out = run(capsys, "decode", "--model", tiny_dir, "--prompt", "a")
    assert code == 2 and "no eos token" in out.err


def test_set_overrides_parse_json_values_and_name_bad_ones():
    import pytest

    from jf_core.config import parse_overrides

    assert parse_overrides(["training.steps=40", "model.path=/x/y", "evaluation.block_sizes=[16, 32]"]) == {
        "training": {"steps": 40},
        "model": {"path": "/x/y"},
        "evaluation": {"block_sizes": [16, 32]},
    }
    with pytest.raises(ValueError, match=r"section\.key=value"):
        parse_overrides(["steps=40"])
    # deeper keys name one field of a nested section
    assert parse_overrides(["evaluation.tune.prompts=4", "evaluation.tune.repeats=1", "evaluation.num_prompts=9"]) == {
        "evaluation": {"tune": {"prompts": 4, "repeats": 1}, "num_prompts": 9}
    }
    with pytest.raises(ValueError, match=r"section\.key=value"):
        parse_overrides(["evaluation..prompts=4"])
    with pytest.raises(ValueError, match=r"evaluation\.tune was set to a value"):
        parse_overrides(["evaluation.tune=3", "evaluation.tune.prompts=4"])
    with pytest.raises(ValueError, match=r"prompts\.hash_splits=null.*leaves the field as it is"):
        parse_overrides(["prompts.hash_splits=null"])  # would be dropped by merge_overrides without a word


def test_ablate_lists_its_catalog_and_refuses_bad_choices_before_any_work(capsys, tmp_path, monkeypatch):
    from jf_core.experiments.ablation import VARIANTS

    monkeypatch.setenv("JF_HOME", str(tmp_path))
    assert main(["ablate", "--list"]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == list(VARIANTS)
    code, out = run(capsys, "ablate", "--variant", "jf zigzag")
    assert code == 2 and "unknown variant(s) ['jf zigzag']" in out.err
    code, out = run(capsys, "ablate", "--seeds", "1,1")
    assert code == 2 and "--seeds needs distinct seeds" in out.err
    assert not (tmp_path / "runs").exists()


def test_every_option_of_every_command_says_what_it_does_and_its_default(capsys):
    import argparse

    from jf_cli.main import build_parser, parsers

    undocumented = [
        f"{prog} {'/'.join(a.option_strings) or a.dest}"
        for prog, p in parsers(build_parser())
        for a in p._actions
        if not a.help and not isinstance(a, argparse._SubParsersAction)
    ]
    assert not undocumented, undocumented
    code, out = run(capsys, "serve", "--help")
    assert code == 0
    help_text = " ".join(out.out.split())  # argparse wraps lines
    assert "the HTTP port (default: 8000)" in help_text
    assert "--name NAME the model id clients send (default: from MODEL)" in help_text  # said once, not twice
    code, out = run(capsys, "tune", "--help")
    assert "repeat for each field; the others as the profile's evaluation.tune.grid says" in " ".join(out.out.split())
    code, out = run(capsys, "decode", "--help")
    assert "same text) (default: 0)" in " ".join(out.out.split())  # a 0 default is shown (0 == False)


def test_the_cli_modules_import_without_a_cycle():
    """Subcommand modules take what they share from jf_cli.common, never from jf_cli.main (which imports them)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "jf_cli"
    arrows: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):  # module-level and function-local imports alike
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jf_cli"):
                found |= {a.name for a in node.names} if node.module == "jf_cli" else {node.module.split(".")[1]}
        arrows[path.stem] = found - {path.stem}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(d == goal or (d not in seen and reaches(d, goal, seen | {d})) for d in arrows.get(start, ()))

    assert arrows["main"], "the graph was read"
    assert [m for m in arrows if reaches(m, m, {m})] == []
