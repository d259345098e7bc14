#!/usr/bin/env bash
# numba-cuda-mlir on a GPU, the call after benchmarks/gpu_session.sh on the same machine:
# its wheel (71 MB, over one call's 64 MiB) travels in two parts, .mlir1 with that call
# and .mlir2 with this one. Then: kbuild's launches of a numba-cuda-mlir project against
# its own JIT (results) and its own launcher (per-launch time), and its backend tests.
set -uo pipefail
OUT=${OUT:-/tmp/kbuild-gpu-out}
mkdir -p "$OUT"
[ -f /tmp/part.aa ] || { echo "no first part: run benchmarks/gpu_session.sh first"; exit 1; }
cat /tmp/part.aa .mlir2/part.ab > /tmp/numba_cuda_mlir-0.6.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    /tmp/numba_cuda_mlir-0.6.0-*.whl 2>&1 | grep -v "^WARNING" || true
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
python3 -m kbuild --version
echo "== numba-cuda-mlir launches"
timeout 300 python3 benchmarks/launch_mlir.py --out "$OUT/launch_mlir.json" 2>&1 | tail -60
echo "== kbuild.enable() serving numba-cuda-mlir kernels on the device"
KBUILD_GPU_TESTS=1 timeout 120 python3 -m pytest -q -p no:cacheprovider -n 0 -o addopts="" \
    -m gpu tests/test_zeroconf_mlir.py 2>&1 | tail -15
echo "== numba-cuda-mlir backend tests (on a machine with a driver)"
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 -o addopts="" -m "not gpu" \
    tests/test_mlir_backend.py 2>&1 | tail -15
