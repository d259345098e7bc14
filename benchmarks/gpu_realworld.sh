#!/usr/bin/env bash
# Zero-config on code nobody here wrote, on a GPU: numba-cuda's own documentation examples
# and a spread of its cudapy test modules, run three ways in one call: plain numba-cuda,
# then `pytest -p kbuild` on an empty store (every kernel compiled through kbuild), then
# again (every kernel from the store). kbuild must fail no test that plain numba passes.
# Same setup as gpu_session.sh (carry .whl).
set -uo pipefail
OUT=${OUT:-/tmp/kbuild-gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --force-reinstall .whl/*.whl 2>&1 | grep -v "^WARNING" || true
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
STORE=$(mktemp -d)/store
MODULES=${MODULES:-"doc_examples cudapy.test_record_dtype cudapy.test_complex cudapy.test_intrinsics
cudapy.test_atomics cudapy.test_lineinfo cudapy.test_debuginfo
cudapy.test_dispatcher cudapy.test_freevar cudapy.test_globals
cudapy.test_constmem cudapy.test_sm cudapy.test_extending cudapy.test_caching
cudapy.test_exception cudapy.test_fastmath cudapy.test_recursion cudapy.test_warp_ops
cudapy.test_random cudapy.test_vectorize cudapy.test_gufunc
cudapy.test_laplace cudapy.test_array_args cudapy.test_math
cudapy.test_launch_config_sensitive cudapy.test_userexc cudapy.test_print"}
ARGS=()
for m in $MODULES; do ARGS+=("numba.cuda.tests.$m"); done
# numba's own runner (its test modules import as `numba.cuda.tests...` only so), in 8
# processes; kbuild is turned on as a user would without touching the suite: KBUILD_ENABLE
# and the start-up hook that installing kbuild puts in site-packages.
python3 - <<'PY'
import site, pathlib
line = ('import os; os.environ.get("KBUILD_ENABLE", "").strip().lower() not in ("", "0", '
        '"false", "no", "off") and __import__("kbuild.zeroconf.startup").zeroconf.startup.start()')
pathlib.Path(site.getsitepackages()[0], "kbuild-enable.pth").write_text(line + "\n")
PY
run() {  # name, environment...
    local name=$1; shift
    local start=$SECONDS
    (cd /tmp && env "$@" timeout 150 python3 -m numba.runtests -m 8 "${ARGS[@]}") \
        > "$OUT/$name.log" 2>&1
    echo "== $name: $(grep -E "^(Ran|OK|FAILED)" "$OUT/$name.log" | tr '\n' ' ') [$((SECONDS - start)) s]"
    grep -E "^(FAIL|ERROR): " "$OUT/$name.log" | sort > "$OUT/$name.failed"
}
# RUNS=kbuild leaves out the plain run (its failures then come from $OUT/plain.failed,
# if an earlier call left it there).
if [ "${RUNS:-all}" = all ]; then run plain KBUILD_ENABLE=; fi
touch "$OUT/plain.failed"
run kbuild_cold KBUILD_ENABLE=1 KBUILD_STORE="$STORE"
echo "   store: $(find "$STORE" -path '*entries*' -name '*.json' | wc -l) entries"
run kbuild_warm KBUILD_ENABLE=1 KBUILD_STORE="$STORE"
for name in kbuild_cold kbuild_warm; do
    echo "== failing under $name but not plain:"
    comm -13 <(sort "$OUT/plain.failed") <(sort "$OUT/$name.failed") | head -60
done
echo "== ZeroConfigWarning kinds (cold):"
grep -o "ZeroConfigWarning.*" "$OUT/kbuild_cold.log" | cut -c1-160 | sort | uniq -c | sort -rn | head -15
