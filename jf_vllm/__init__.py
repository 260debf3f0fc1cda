"""Jacobi Forcing decoding inside vLLM: a speculative-decoding proposer whose draft is the Jacobi update, plus the
narrow patches it needs, loaded in every vLLM process through the `vllm.general_plugins` entry point. Lives in its own
environment (scripts/setup_vllm.sh); nothing in the main environment imports vllm."""
