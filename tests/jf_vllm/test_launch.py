"""jf_vllm.launch's checks that need no vLLM environment."""

from __future__ import annotations

from jf_core.draft_adapter.adapter import FILE
from jf_vllm.launch import OMP_BIND_ENV, draft_adapter_notice, vllm_env


def test_a_model_directory_with_a_draft_adapter_is_told_that_vllm_drafts_with_the_base(tmp_path):
    assert draft_adapter_notice(str(tmp_path)) is None
    (tmp_path / FILE).write_bytes(b"")  # jf_core's own name for the file: the notice must follow it if it moves
    notice = draft_adapter_notice(str(tmp_path))
    assert notice is not None and FILE in notice and "base" in notice


def test_vllms_threads_follow_jf_cpus_unbound_and_a_users_binding_is_kept(monkeypatch):
    monkeypatch.delenv(OMP_BIND_ENV, raising=False)
    monkeypatch.delenv("JF_CPUS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert OMP_BIND_ENV not in vllm_env()  # a machine of its own: vLLM's binding, one thread a core
    monkeypatch.setenv("JF_CPUS", "1")
    env = vllm_env()
    assert env[OMP_BIND_ENV] == "nobind" and env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv(OMP_BIND_ENV, "0")
    assert vllm_env()[OMP_BIND_ENV] == "0"
