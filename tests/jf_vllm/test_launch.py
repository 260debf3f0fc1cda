"""jf_vllm.launch's checks that need no vLLM environment."""

from __future__ import annotations

from jf_core.draft_adapter.adapter import FILE
from jf_vllm.launch import draft_adapter_notice


def test_a_model_directory_with_a_draft_adapter_is_told_that_vllm_drafts_with_the_base(tmp_path):
    assert draft_adapter_notice(str(tmp_path)) is None
    (tmp_path / FILE).write_bytes(b"")  # jf_core's own name for the file: the notice must follow it if it moves
    notice = draft_adapter_notice(str(tmp_path))
    assert notice is not None and FILE in notice and "base" in notice
