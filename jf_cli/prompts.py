"""`jf prompts prepare`: a prompt dataset -> the prompt store a profile names (jf_core/trajectory/prepare.py).
`jf prompts add`: a new prompt file -> stored and announced, so event-triggered deployments retrain on it.

    jf prompts prepare --profile qwen2.5-coder-7b --source OpenCodeInstruct.jsonl --text-field input \\
        --max-prompt-tokens 2048 --calibration 200 --out data/opencodeinstruct
"""

from __future__ import annotations

import argparse

from jf_cli.common import args_profile, model_path, positive


def cmd_prepare(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from jf_core.trajectory.prepare import prepare_prompts

    profile = args_profile(args)
    fields = {
        "source": args.source,
        "split": args.split,
        "text_field": args.text_field,
        "messages_field": args.messages_field,
        "id_field": args.id_field,
        "min_prompt_tokens": args.min_prompt_tokens,
        "max_prompt_tokens": args.max_prompt_tokens,
        "limit": args.limit,
    }
    source = profile.prompts.model_copy(update={k: v for k, v in fields.items() if v is not None})
    tokenizer = AutoTokenizer.from_pretrained(
        args.tokenizer or model_path(None, profile),
        trust_remote_code=profile.model.trust_remote_code,
    )
    report = prepare_prompts(source, tokenizer, args.out, calibration=args.calibration, seed=args.seed)
    print(
        f"{report.rows_read} rows read -> {report.train} training and {report.calibration} calibration prompts in "
        f"{report.out}; skipped: {report.skipped or 'none'}"
    )
    print(f"profile: prompts.source={report.out} prompts.id_field=id evaluation.calibration_split=calib")
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    from jf_core.trajectory.prompt_store import add_prompt_file

    profile = args_profile(args)
    collection = args.collection or profile.name
    added = add_prompt_file(args.file, collection, profile.prompts)
    print(f"{added.rows} prompts {'stored' if added.new else 'already stored'} at {added.uri}")
    if args.no_event:
        return 0
    from jacobi_forcing.tasks.events import PROMPTS_ADDED, emit_now, prompts_resource

    payload = {"uri": added.uri, "rows": added.rows, "sha256": added.sha256, "profile": profile.name}
    try:
        event_id = emit_now(PROMPTS_ADDED, prompts_resource(collection), payload)
    except RuntimeError as err:  # the file is stored; adding it again is idempotent and sends the event
        raise ValueError(f"{err}; the file is stored, run the same command again to announce it") from err
    print(f"event {PROMPTS_ADDED} {event_id} sent for jf.prompts.{collection}: deployments triggered by it start now")
    return 0


def register(sub) -> None:
    prompts = sub.add_parser("prompts", help="prepare prompt datasets for trajectories")
    psub = prompts.add_subparsers(dest="prompts", required=True)
    p = psub.add_parser("prepare", help="filter by token length, drop duplicates, hold out a calibration split")
    p.add_argument("--profile", default="tiny", help="its tokenizer and prompt format (chat template, system prompt)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    p.add_argument("--source", required=True, help="JSONL(.gz), Parquet, a datasets directory or a hub dataset id")
    p.add_argument("--split", help="hub or datasets split (default: the profile's)")
    p.add_argument("--text-field", help="the prompt text's field")
    p.add_argument("--messages-field", help="a chat-messages field instead")
    p.add_argument("--id-field", help="a field with unique ids (default: the row number)")
    p.add_argument("--min-prompt-tokens", type=positive("--min-prompt-tokens"), help="drop shorter prompts")
    p.add_argument("--max-prompt-tokens", type=positive("--max-prompt-tokens"), help="drop longer prompts")
    p.add_argument("--limit", type=positive("--limit"), help="rows to read")
    p.add_argument("--calibration", type=positive("--calibration"), default=200, help="prompts held out")
    p.add_argument("--tokenizer", help="tokenizer directory or hub id (default: the profile's model)")
    p.add_argument("--seed", type=int, default=0, help="the calibration split's hash seed")
    p.add_argument("--out", required=True, help="the store's directory")
    p.set_defaults(func=cmd_prepare)
    a = psub.add_parser(
        "add",
        help="store a prompt file and announce it (event jf.prompts.added): triggered deployments retrain on it",
    )
    a.add_argument("file", help="JSONL(.gz) or Parquet with the profile's prompt field")
    a.add_argument("--profile", default="tiny", help="whose prompt fields the file must have (default: tiny)")
    a.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    a.add_argument(
        "--collection",
        help="the prompt collection (event resource jf.prompts.<collection>; default: the profile's name)",
    )
    a.add_argument("--no-event", action="store_true", help="store only; announce nothing")
    a.set_defaults(func=cmd_add)
