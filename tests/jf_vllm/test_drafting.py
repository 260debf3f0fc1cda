"""The plugin's drafting rules without vLLM: the Jacobi update on a verification record, fresh blocks, recycling,
and a vLLM-shaped decoding loop (prefill, then verify [last token, drafts] and commit the accepted prefix plus one)
driven by JacobiDrafter against a real model, which must commit the same tokens in the same forwards as jf_core's
own Jacobi decoder on that model."""

from __future__ import annotations

import pytest
import torch

from jf_core.decoding.draft import prompt_sample, sequence_rng
from jf_vllm.drafting import JacobiDraftConfig, JacobiDrafter, Row, Verification
from jf_vllm.spec_config import speculative_config
from jf_vllm.versions import UnsupportedVLLMVersion, check_vllm_version
from tests.conftest import serving_prior


def _row(sampled, verification=None, context=None, max_left=100, req_id="r"):
    prompt = [5, 6, 7]
    return Row(req_id, prompt, context or [*prompt, *sampled], list(sampled), max_left, verification)


def test_the_draft_is_the_models_guesses_past_the_first_rejection():
    drafter = JacobiDrafter(JacobiDraftConfig(block_size=5), vocab_size=50)
    v = Verification(drafts=[1, 2, 3, 4], argmax=[1, 2, 9, 8], bonus=7)
    # accepted d1, d2; committed d1, d2 and the correction argmax[2] = 9
    assert drafter.draft(_row([1, 2, 9], v), limit=4) == [8]
    assert drafter.stats.jacobi_updates == 1 and drafter.stats.inconsistent == 0


def test_a_converged_block_opens_a_fresh_one_drawn_like_jf_cores_drafts():
    drafter = JacobiDrafter(JacobiDraftConfig(block_size=5, seed=3), vocab_size=50)
    all_accepted = Verification(drafts=[1, 2, 3, 4], argmax=[1, 2, 3, 4], bonus=7)
    context = [5, 6, 7, 1, 2, 3, 4, 7]
    draft = drafter.draft(_row([1, 2, 3, 4, 7], all_accepted, context=context), limit=4)
    rng = sequence_rng(3, [5, 6, 7])
    assert draft == prompt_sample(context, 4, rng)
    assert drafter.stats.blocks_opened == 1
    # only the last draft rejected: the block is at its fixed point; a plain step computes the next block's first
    last_wrong = Verification(drafts=[1, 2, 3, 4], argmax=[1, 2, 3, 9], bonus=7)
    assert drafter.draft(_row([1, 2, 3, 9], last_wrong), limit=4) == []
    assert len(drafter.draft(_row([6]), limit=4)) == 4
    assert drafter.stats.blocks_opened == 2


def test_limits_budget_and_prefill_rows_cap_the_draft():
    drafter = JacobiDrafter(JacobiDraftConfig(block_size=9), vocab_size=50)
    assert drafter.draft(_row([]), limit=8) == []  # still in prefill: nothing sampled
    assert drafter.draft(_row([4]), limit=0) == []  # vLLM's schedule says 0 at this batch size
    assert len(drafter.draft(_row([4], req_id="a"), limit=3)) == 3
    assert len(drafter.draft(_row([4], max_left=2, req_id="b"), limit=8)) == 2  # never past max_tokens


def test_a_record_that_does_not_match_the_committed_tokens_is_counted_and_not_used():
    drafter = JacobiDrafter(JacobiDraftConfig(block_size=5), vocab_size=50)
    v = Verification(drafts=[1, 2, 3, 4], argmax=[1, 2, 9, 8], bonus=7)
    draft = drafter.draft(_row([6, 6, 9], v), limit=4)  # vLLM committed 6, 6: not a prefix of the drafts
    assert drafter.stats.inconsistent == 1 and len(draft) == 4


def test_recycling_seeds_a_fresh_block_with_an_earlier_guess():
    drafter = JacobiDrafter(JacobiDraftConfig(block_size=4, recycle=True), vocab_size=50)
    v = Verification(drafts=[1, 2, 3], argmax=[1, 9, 8], bonus=7)
    drafter.draft(_row([1, 9], v), limit=3)  # pools [9, 8, 7]: after 9 came 8, 7
    all_accepted = Verification(drafts=[8, 3, 4], argmax=[8, 3, 4], bonus=9)
    draft = drafter.draft(_row([8, 3, 4, 9], all_accepted), limit=3)
    assert draft[:2] == [8, 7] and drafter.stats.recycled_drafts == 1


def test_block_size_and_versions_are_checked_by_name():
    with pytest.raises(ValueError, match="block_size"):
        JacobiDraftConfig(block_size=1)
    check_vllm_version("0.32.0+cpu")
    with pytest.raises(UnsupportedVLLMVersion, match=r"0\.31\.2"):
        check_vllm_version("0.31.2")


def test_the_stored_decode_config_becomes_vllms_speculative_config(tmp_path):
    import json

    block = {"decode": {"block_size": 32}, **serving_prior(ar_above_batch=4).block()}
    (tmp_path / "config.json").write_text(json.dumps({"jacobi_forcing": block}))
    spec = speculative_config(tmp_path, max_num_seqs=16)
    assert spec["method"] == "custom_class" and spec["model"] == "jf_vllm.proposer.JacobiProposer"
    assert spec["num_speculative_tokens"] == 31
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 31], [5, 16, 0]]
    assert "num_speculative_tokens_per_batch_size" not in speculative_config(tmp_path, ar_above_batch=None)
    assert speculative_config(tmp_path, ar_above_batch=0, max_num_seqs=8)["num_speculative_tokens_per_batch_size"] == [
        [1, 8, 0]
    ]
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        speculative_config(tmp_path / "missing")


def _vllm_shaped_decode(model, prompt, block_size, max_new, eos):
    """vLLM's speculative loop with JacobiDrafter as the proposer: one forward per step over [last, drafts]."""
    drafter = JacobiDrafter(JacobiDraftConfig(block_size=block_size), model.config.vocab_size)
    committed, verification, accepted_per_step = [], None, []
    with torch.no_grad():
        committed.append(int(model(torch.tensor([prompt])).logits[0, -1].argmax()))  # prefill
        sampled = list(committed)
        while len(committed) < max_new and committed[-1] not in eos:
            context = [*prompt, *committed]
            draft = drafter.draft(Row("r", prompt, context, sampled, max_new - len(committed), verification), 99)
            greedy = model(torch.tensor([context + draft])).logits[0, len(context) - 1 :].argmax(-1).tolist()
            a = 0
            while a < len(draft) and draft[a] == greedy[a]:
                a += 1
            sampled = [*draft[:a], greedy[a]][: max_new - len(committed)]
            committed += sampled
            accepted_per_step.append(len(sampled))
            verification = Verification(draft, greedy[: len(draft)], greedy[len(draft)]) if draft else None
    return committed, accepted_per_step


def test_a_vllm_shaped_loop_with_the_drafter_is_jf_cores_jacobi_decoder_forward_for_forward(embedded):
    from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
    from jf_core.models import stop_tokens
    from jf_core.toy.task import make_split

    model, tok = embedded
    stops = stop_tokens(model, tok)
    for example in make_split("test", 3):
        prompt = tok(example.prompt)["input_ids"]
        for n in (4, 8):
            ours = jacobi_decode(model, [prompt], JacobiConfig(block_size=n, max_new_tokens=40), stop=stops)
            tokens, steps = _vllm_shaped_decode(model, prompt, n, 40, set(stops.eos))
            assert tokens == ours.sequences[0]
            # tokens committed per forward after prefill, forward for forward
            assert steps == ours.stats.sequences[0].accepted
            assert max(steps) > 1  # the embedded model accepts drafts: the update is exercised
