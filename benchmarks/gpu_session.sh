#!/usr/bin/env bash
# What a GPU session runs through the device tool, in one call: the GPU tests (real
# launches compared with numba's JIT), the launch benchmark, and zero-config on a device.
# The device's Python has numpy 2.5, which numba cannot import: cp312 wheels of numpy 2.4,
# numba-cuda 0.30.4, cuda-core and filecheck travel in .whl/ (see the device tool's README).
set -uo pipefail
OUT=${OUT:-/tmp/kbuild-gpu-out}
mkdir -p "$OUT"
# The first part of numba-cuda-mlir's wheel (over one call's 64 MiB with the rest), kept
# on the machine for benchmarks/gpu_mlir.sh, which brings the second part.
if [ -d .mlir1 ]; then cp .mlir1/* /tmp/; fi
# Into the interpreter's own site-packages (the machine is bare and given back after):
# tests and benchmarks start subprocesses with a PYTHONPATH of their own.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --force-reinstall .whl/*.whl 2>&1 | grep -v "^WARNING" || true
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
python3 -c "import sys, numba, numba_cuda, numpy, cuda.core; print(sys.version.split()[0], \
'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__, \
'cuda.core', cuda.core.__version__)"
python3 -m kbuild --version
echo "== GPU tests (the fastmath denormal check, bitwise against numba's JIT, among them)"
KBUILD_GPU_TESTS=1 timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 \
    --dist loadfile -o addopts="" -rfEs tests/ 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
echo "== launch benchmark"
timeout 120 python3 benchmarks/launch.py --launches 10000 --out "$OUT/launch.json" 2>&1 | tail -30
[ "${KBUILD_GPU_FULL:-0}" = 1 ] || exit 0  # the rest when the device time allows
echo "== zero-config benchmark"
timeout 120 python3 benchmarks/zeroconfig.py --kernels 16 --repeats 3 \
    --out "$OUT/zeroconfig.json" 2>&1 | tail -20
echo "== cold builds at -j1..-j16 (N=512)"
timeout 280 python3 benchmarks/jobs.py --n 512 --jobs 1,2,4,8,16 --out "$OUT/jobs.json" 2>&1 | tail -10
