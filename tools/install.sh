#!/usr/bin/env bash
# Installs ppma with everything into the active python3: torch, the OpenMMLab stack
# (mmcv 2.1.0 built from source with CPU ops), visualization and test tools.
# Idempotent: a second run finds mmcv built and pip's cache warm, and takes a minute.
#   bash tools/install.sh            # PYTHON=/path/to/python to choose the interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install --disable-pip-version-check "$@"; }

pip_install "torch==2.14.1" "torchvision==0.29.1" wheel ninja

if "$PY" - <<'PYEOF' 2>/dev/null
import mmcv, mmcv.ops  # mmcv.ops fails without the compiled extension
assert mmcv.__version__ == "2.1.0"
PYEOF
then
    echo "mmcv 2.1.0 with ops is already installed"
else
    # mmcv 2.1.0's setup imports pkg_resources, which setuptools>=70 lacks; torch itself wants
    # setuptools>=77, which is restored once mmcv is built. ninja compiles on every core.
    pip_install "setuptools<70"
    # torch 2.14 headers need C++20 but mmcv's setup passes -std=c++14/17 last: compile
    # through wrappers that rewrite the flag.
    wrap=$(mktemp -d)
    trap 'rm -rf "$wrap"' EXIT
    for pair in cc:gcc cxx:g++; do
        name=${pair%%:*}; real=$(command -v "${pair##*:}")
        cat >"$wrap/$name" <<WRAPEOF
#!/usr/bin/env bash
args=()
for a in "\$@"; do
    case "\$a" in -std=c++14|-std=c++17) a=-std=c++20 ;; esac
    args+=("\$a")
done
exec "$real" "\${args[@]}"
WRAPEOF
        chmod +x "$wrap/$name"
    done
    CC="$wrap/cc" CXX="$wrap/cxx" MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS="$(nproc)" \
        pip_install --no-build-isolation "mmcv==2.1.0"
    pip_install "setuptools>=77.0.3"
fi

pip_install -e ".[full,export]"
