#!/usr/bin/env bash
# Run on the lent GPU host (see README "GPU runs"): unpack the carried Warp/cuDSS bundle once, then
# run one stage: `tests`, `bench` (all benchmarks), or any command given after `--`.
set -u
cd "$(dirname "$0")/.."
if [ ! -d /tmp/site/warp ]; then
  cat /tmp/gpu/site.part* > /tmp/gpu/site.tar.xz &&
  mkdir -p /tmp/site &&
  python3 -c "import tarfile; tarfile.open('/tmp/gpu/site.tar.xz').extractall('/tmp/site')" || exit 3
fi
export PYTHONPATH=/tmp/site:$PWD
export LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export WARP_CACHE_PATH=/tmp/warpcache WARP_MESHAD_CACHE_PATH=/tmp/warpcache/gen
OUTDIR=${OUT:-/tmp/out}
mkdir -p "$OUTDIR"
stage=${1:-tests}
shift || true
case "$stage" in
  tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUTDIR/gpu_info.txt"
    WARP_MESHAD_TEST_DEVICE=cuda:0 python3 -m pytest -q -rs "$@" 2>&1 | tee "$OUTDIR/gpu_tests.log"
    ;;
  bench)
    BENCH_OUT="$OUTDIR" python3 -m benchmarks.mass_spring "$@" 2>&1 | tee "$OUTDIR/bench_mass_spring.log"
    ;;
  --)
    "$@" 2>&1 | tee "$OUTDIR/cmd.log"
    ;;
esac
