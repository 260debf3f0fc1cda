"""`jf run` (the main job: one `jf-round` flow run of a profile, in process; `--progressive` for its rounds) and
`jf stack up|down|status`."""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
from pathlib import Path

from jf_core import pins
from jf_core.config import parse_overrides
from jf_core.paths import jf_home


def flow_process() -> None:
    """What a command that runs a flow in this process sets first (`jf run`, `jf ablate`): SIGTERM unwinds like
    Ctrl-C, and Prefect's and MLflow's environment. Before prefect is imported: without a server URL, Prefect runs
    an ephemeral server on the sqlite database of PREFECT_HOME, the same one `jf stack up` serves, so these runs
    show up in its UI later."""
    sigterm_unwinds()
    os.environ.setdefault("PREFECT_HOME", str(jf_home() / "prefect"))
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # Prefect creates one level only
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")


def sigterm_unwinds() -> None:
    """SIGTERM (`kill`, a scheduler stopping the job) unwinds like Ctrl-C. Python's default dies on the spot, which
    skipped every cleanup and left the temporary Prefect server and the round's Ray running; as a
    KeyboardInterrupt, the flow run is closed, the Ray session shuts its processes down and Prefect's exit hooks stop
    the server."""

    def interrupt(signum, _frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)


def temporary_server_apart() -> None:
    """Start Prefect's temporary server (used when no PREFECT_API_URL is set) in a session of its own. A terminal's
    Ctrl-C goes to its whole foreground process group, and Prefect starts the server in ours: the Ctrl-C killed it
    too, and the interrupted run then spent minutes retrying to tell the dead server it had crashed instead of
    exiting. Apart, the server hears only jf: Prefect's exit hook still stops it."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value() or not pins.require("prefect-server"):  # another Prefect: its own start, as before
        return

    class Apart(SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen:
            # Prefect's own command and environment, in a new session. subprocess.Popen is swapped for the moment of
            # this call, which jf makes before the flow starts any thread that could spawn a process meanwhile.
            popen = subprocess.Popen
            subprocess.Popen = functools.partial(popen, start_new_session=True)
            try:
                return super()._run_uvicorn_command()
            finally:
                subprocess.Popen = popen

    Apart().start()  # the instance every Prefect client of this process asks for (it is kept by port: None)


def cmd_run(args: argparse.Namespace) -> int:
    flow_process()
    overrides = parse_overrides(args.set or [])
    from jf_core.config import load_profile
    from jf_core.planning import check

    profile = load_profile(args.profile, **overrides)
    check(profile)  # bad parameters or a plan that cannot fit: before any server
    if profile.compute.gpus_per_worker > 0 and profile.compute.gpu_limit:
        from jacobi_forcing.infra import gpu_limit

        gpu_limit.ensure(name=profile.compute.gpu_limit)  # this host's GPUs, unless the server already has one
    temporary_server_apart()
    from jacobi_forcing.flows.round import jf_round
    from jacobi_forcing.tasks.mlflow_runs import tracking_uri
    from jacobi_forcing.tasks.reporting import markdown_table
    from jf_core.evaluation.results import adapter_part, against_untrained
    from jf_core.round.report import resumed_note, stage_times

    if args.progressive:
        from jacobi_forcing.flows.progressive import jf_progressive

        summaries = jf_progressive(profile, model=args.model)
        for i, s in enumerate(summaries[:-1]):
            print(f"round {i} (n={s.block_size}): accuracy {s.accuracy:.3f}, TPF {s.headline_tpf:.2f}")
        summary = summaries[-1]
    else:
        summary = jf_round(profile, model=args.model)  # built once, above: the flow takes it as it is
    # What the flow returned, as it returned it: the headline, its table and the registration.
    reg, dtype = summary.registry, summary.dtype
    print()
    print(markdown_table(summary.metrics))
    versus = against_untrained(
        summary.speedup_vs_untrained, summary.best_untrained, summary.timing_spread, summary.untrained_interval
    )
    print(
        f"\naccuracy {summary.accuracy:.3f} (input model {summary.base_accuracy:.3f}); "
        f"TPF {summary.headline_tpf:.2f} ({_decode_label(summary.decode_config)}); "
        f"speedup vs our AR {summary.speedup_vs_ar:.2f}x; trained {summary.train_seconds:.0f} s"
        f"{resumed_note(summary.resumed_from_step)}\n"
        f"{stage_times(summary.stage_seconds)}\n"
        f"{versus}\n"
        f"{adapter_part(summary.speedup_vs_no_adapter, summary.adapter_left_out)}"
        f"identical to greedy AR: {summary.identical_fraction:.3f} of the evaluation prompts ({dtype}"
        + ("; fp32 promises 1.000)" if dtype == "float32" else "; measured, see docs/decoding.md, 'numerics')")
    )
    verdict = "passed: now champion" if reg.gate_passed else "failed: champion unchanged"
    print(f"registry: {reg.model_name} version {reg.version}, gate {verdict}")
    for gate_check in reg.gate_checks:  # a reused registration carries its verdict only
        print(f"  {'ok  ' if gate_check.passed else 'FAIL'} {gate_check.name}: {gate_check.reason}")
    uri = tracking_uri(profile.registry)
    print(
        "\nwhere to look:\n"
        f"  round directory  {summary.round_dir}\n"
        f"  Prefect UI       {os.environ.get('PREFECT_API_URL', 'http://127.0.0.1:4200/api')[:-4]}"
        "  (`jf stack up` serves this run's history)\n"
        f"  MLflow           {uri}  (UI: `jf stack up`, then http://127.0.0.1:5000, experiment 'jacobi-forcing')\n"
        f"  registry model   models:/{reg.model_name}@{'champion' if reg.gate_passed else 'challenger'}\n"
        f"  to load it from Python or `mlflow models serve`: export MLFLOW_TRACKING_URI={uri}"
    )
    return 0


def _decode_label(cfg) -> str:
    """What decoded the headline: the tuned Jacobi Forcing config, or plain Jacobi at the chosen n."""
    from jf_core.decoding import JFDecodeConfig

    if isinstance(cfg, JFDecodeConfig):
        return f"tuned: {cfg.describe()}"
    return f"plain Jacobi, {cfg.describe()} chosen on calibration prompts"


def cmd_stack(args: argparse.Namespace) -> int:
    from jacobi_forcing.infra import stack

    if args.action == "up":
        cfg = stack.StackConfig(prefect_port=args.prefect_port, mlflow_port=args.mlflow_port, ray=args.ray)
        info = stack.up(cfg)
        print(f"Prefect UI  {info['ui']['prefect']}\nMLflow UI   {info['ui']['mlflow']}")
        print(f"worker      pool {stack.POOL} (process); logs under {stack.stack_dir()}")
        print(f"clients:    source {stack.stack_dir() / 'stack.env'}")
    elif args.action == "down":
        stopped = stack.down()
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    else:
        print(json.dumps(stack.status(), indent=2))
    return 0


def register(sub) -> None:
    p = sub.add_parser("run", help="the main job: one jf-round flow run (the embedded default's, unless --profile)")
    p.add_argument("--profile", default="tiny", help="profile name or YAML path")
    p.add_argument("--model", help="starting model: directory, hub id or models:/<name>@<alias>")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    p.add_argument("--progressive", action="store_true", help="run the profile's rounds (jf-progressive) instead")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("stack", help="the local Prefect + MLflow (+ Ray) stack on 127.0.0.1")
    p.add_argument("action", choices=["up", "down", "status"], help="start, stop, or say what runs")
    p.add_argument("--prefect-port", type=int, default=4200, help="the Prefect server's port")
    p.add_argument("--mlflow-port", type=int, default=5000, help="the MLflow server's port")
    p.add_argument("--ray", action="store_true", help="also start a Ray head")
    p.set_defaults(func=cmd_stack)
