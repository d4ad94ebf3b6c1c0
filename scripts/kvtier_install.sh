# Sourced by scripts/demo.sh and scripts/test_vllm.sh (not run): installs this checkout's kvtier package into a vLLM
# venv unless that venv already holds exactly this checkout's build, and keeps any other run from replacing it for
# as long as the caller lives.
#
#   source scripts/kvtier_install.sh
#   kvtier_install_into VENV || ...   # uses $VENV/bin/python; says why and returns 1 on failure
#
# Several clones share one vLLM venv (scripts/setup_vllm.sh keys it by python/requirements-vllm.txt only), so a
# stamp next to the install, $VENV/.kvtier-install, records what is installed: the hash of the sources the build
# reads (kvtier_source_hash) and the hash of the installed distribution's RECORD. Any other install into the venv
# (another clone's, a plain `pip install .`) changes the RECORD and so invalidates the stamp: the next run here
# reinstalls instead of running that other build. The install runs under an exclusive flock on
# $VENV/.kvtier-install.lock (fd 8); the caller then keeps a shared lock on it until it exits (inherited by its
# children: pytest, servers), so no other run reinstalls under a running demo or test run.
#
# Builds one wheel in build-vllm/wheel/<wheel tag> of this checkout (incremental) with a small builder venv of the
# same interpreter (build-vllm/builder: scikit-build-core and nanobind only; the extension links neither vLLM nor
# torch, so one wheel serves every vLLM release), then installs it into the venv with --no-deps.

kvtier_source_hash() {
    # Every file the package build reads, tracked or not (not ignored), with its contents; 16 hex digits.
    local repo=$1
    (cd "$repo" && git ls-files -co --exclude-standard -- CMakeLists.txt CMakePresets.json pyproject.toml README.md \
        src include tools python/kvtier cmake 2>/dev/null | LC_ALL=C sort \
        | while read -r f; do [[ -f "$f" ]] && echo "$f"; done | xargs -d '\n' sha256sum | sha256sum | cut -c1-16)
}

kvtier_record_hash() {
    # sha256 of the installed kvtier distribution's RECORD (every installed file and its hash), or "none".
    "$1" - <<'EOF' 2>/dev/null || echo none
import hashlib, importlib.metadata as md
try:
    rec = md.distribution("kvtier").read_text("RECORD") or ""
except md.PackageNotFoundError:
    rec = ""
print(hashlib.sha256(rec.encode()).hexdigest()[:16] if rec else "none")
EOF
}

kvtier_install_into() {
    local venv=$1 repo py stamp_file want
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    py="$venv/bin/python"
    stamp_file="$venv/.kvtier-install"
    exec 8>"$venv/.kvtier-install.lock"
    if ! flock -x -n 8; then
        echo "kvtier_install: waiting for another run using $venv (lock $venv/.kvtier-install.lock)" >&2
        flock -x 8
    fi
    want="source=$(kvtier_source_hash "$repo")"
    if [[ "$want" == "source=" ]] || [[ "$(cat "$stamp_file" 2>/dev/null)" != "$want record=$(kvtier_record_hash "$py")" ]] \
        || ! "$py" -c "import kvtier._kvtier" 2>/dev/null; then
        echo "=== installing kvtier from $repo into $venv (C++ build in build-vllm/, minutes the first time) ===" >&2
        local builder="$repo/build-vllm/builder" dist="$repo/build-vllm/dist"
        if ! "$builder/bin/python" -c "import scikit_build_core, nanobind" 2>/dev/null; then
            echo "=== creating the kvtier wheel builder $builder ===" >&2
            rm -rf "$builder"
            "$("$py" -c 'import sys; print(sys._base_executable)')" -m venv "$builder" >&2 &&
                "$builder/bin/python" -m pip install -q --disable-pip-version-check scikit-build-core==1.1.2 \
                    nanobind==3.1.0 >&2 \
                || { echo "kvtier_install: could not make the wheel builder $builder" >&2; return 1; }
        fi
        # The venv gets the build tools too: `pip install --no-build-isolation .` there (the README's test, a user's
        # incremental rebuild) needs them.
        if ! "$py" -c "import scikit_build_core, nanobind" 2>/dev/null; then
            "$py" -m pip install -q --disable-pip-version-check scikit-build-core==1.1.2 nanobind==3.1.0 >&2 \
                || { echo "kvtier_install: could not install scikit-build-core and nanobind into $venv" >&2; return 1; }
        fi
        rm -f "$stamp_file"
        rm -rf "$dist"
        (cd "$repo" && CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$builder/bin/python" -m pip wheel -q \
            --disable-pip-version-check --no-deps --no-build-isolation -C build-dir="build-vllm/wheel/{wheel_tag}" \
            -w "$dist" . >&2) || { echo "kvtier_install: building the kvtier wheel failed (above)" >&2; return 1; }
        "$py" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$dist"/kvtier-*.whl >&2 \
            || { echo "kvtier_install: installing the kvtier wheel into $venv failed (above)" >&2; return 1; }
        [[ "$want" == "source=" ]] || echo "$want record=$(kvtier_record_hash "$py")" > "$stamp_file"
    fi
    flock -s 8  # downgrade: other runs may use this install, none may replace it, while this caller lives
}
