# Sourced by scripts/setup.sh and scripts/setup_vllm.sh: how a virtual environment gets its packages.
#
# torch goes in first with pip: the pinned CPU wheel lies on this machine's disk, where only pip's configuration looks
# (an index uv would ask instead holds a CUDA build of the same version, gigabytes of it). Everything after torch goes
# in with uv, which resolves, downloads and unpacks in parallel: both environments from nothing, side by side, in
# 118-167 s against pip's 207-234 s, and a second run of setup.sh (the README's test command runs it again) in 10 s
# against 23 (2026-12-03, this project's 2-core machine, the same packages to the version). Byte-compiled as pip does
# (71 s of those 167): this machine sets PYTHONDONTWRITEBYTECODE, so a module left uncompiled would be compiled again
# by every process that imports it. uv is held to the installed torch, so a requirement that torch cannot meet fails
# by name instead of fetching another build. Where uv cannot be installed or fails, pip does the step and says so.

# venv_pip VENV ARGS...: pip into VENV, quiet; only this machine's noisy mirror warnings are filtered (with
# pipefail a pip failure still fails the caller).
venv_pip() {
  local venv="$1"; shift
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }
}

# venv_fast_install VENV ARGS...: the same install through uv (pip's arguments it shares: -e, --no-deps, specs).
venv_fast_install() {
  local venv="$1"; shift
  if [ -z "${JF_NO_UV:-}" ] && { [ -x "$venv/bin/uv" ] || venv_pip "$venv" "uv>=0.13,<0.14"; } && [ -x "$venv/bin/uv" ]; then
    local torch_pin="$venv/.jf-torch-constraint.txt"
    "$venv/bin/python" -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" > "$torch_pin"
    # The platform's certificate store (where this machine's registry proxy puts its CA); pip reads the same store.
    if UV_SYSTEM_CERTS="${UV_SYSTEM_CERTS:-1}" "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" \
        --constraints "$torch_pin" --compile-bytecode "$@"; then
      return 0
    fi
    echo "uv could not install $*: pip instead" >&2
  fi
  venv_pip "$venv" "$@"
}
