#!/usr/bin/env bash
# Run on the lent GPU host (tools/gpu/README.md): gather the carried parts of the wheel bundle, install it once into
# /tmp/site, then run one stage:
#   receive (gather only: the transfer calls), tests, tests_pile, pile (spot_pile, resumable), bench (mass-spring),
#   cache, bench19, bench20, factorizations, apps19, apps_loops, gc, keep, symmetric, analyses, cudss_direct,
#   newton_tet, pack <stage> ... (one archive of the stage's files), or any command after `--`.
# The bundle (bash tools/gpu/bundle.sh) is .gpu/manifest.json, carried in every call, and .gpu/wheels.partNN, one
# part a call; the parts gather in /tmp/gpu while the machine stays warm. GPU_PARTS and GPU_SITE move those two
# folders (a rehearsal on another machine).
set -u
cd "$(dirname "$0")/../.."
parts=${GPU_PARTS:-/tmp/gpu} site=${GPU_SITE:-/tmp/site}
stage=${1:-tests}
shift || true
wheels() { env -u PYTHONPATH -u PYTHONSAFEPATH python3 -m tools.gpu.wheels "$@"; }  # the host's own packages
if [ -f .gpu/manifest.json ]; then
  wheels receive .gpu "$parts" || exit 3
elif [ ! -f "$parts/manifest.json" ]; then
  echo "no .gpu/manifest.json carried and none received before: build the bundle with bash tools/gpu/bundle.sh" >&2
  exit 3
fi
# kernels compiled before: carried as .gpu/warpcache.tar.xz (or copied to $parts by an earlier call), from this
# host's `cache` stage on an earlier machine or from `python -m tools.gpu.aot_cuda` on a machine without a GPU
for cache in .gpu/warpcache.tar.xz "$parts/warpcache.tar.xz"; do
  if [ -f "$cache" ] && [ ! -d /tmp/warpcache ]; then
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('/tmp')" "$cache"
  fi
done
[ "$stage" = receive ] && exit 0
# every wheel checked against the manifest's sha256; fallbacks only where the host's own version falls short
wheels install "$parts" "$site" || exit $?
# the package as pip's editable install maps it (pyproject package-dir: kernels/ -> warp_meshad.kernels, apps/ ->
# warp_meshad.apps), without installing: a folder of links to this checkout
rm -rf /tmp/pkg && mkdir -p /tmp/pkg/warp_meshad
for entry in "$PWD"/warp_meshad/*; do ln -s "$entry" /tmp/pkg/warp_meshad/; done
ln -s "$PWD/kernels" /tmp/pkg/warp_meshad/kernels
ln -s "$PWD/apps" /tmp/pkg/warp_meshad/apps
[ -d "$PWD/warp_meshad/configs" ] || ln -s "$PWD/configs" /tmp/pkg/warp_meshad/configs
# the checkout's bytecode, as an install writes it (once per tree: later calls find it)
python3 -m compileall -q -j 0 warp_meshad kernels apps benchmarks tools tests >/dev/null 2>&1 || true
export PYTHONPATH=$site:/tmp/pkg:$PWD PYTHONSAFEPATH=1  # safe path: python -m must not put the checkout (no kernels/ inside warp_meshad/) first
export LD_LIBRARY_PATH=$site/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export WARP_CACHE_PATH=/tmp/warpcache WARP_MESHAD_CACHE_PATH=/tmp/warpcache/gen
OUTDIR=${OUT:-/tmp/out}
mkdir -p "$OUTDIR"
run_tests() {
  # pytest-xdist (on the host's image) spreads the NVRTC compiles of the test kernels over the cores. Outcomes and
  # failures are logged as they happen (tools/gpu/pytest_outcomes.py), so a run cut short still reports what it did.
  local xdist=()
  python3 -c "import xdist" 2>/dev/null && xdist=(-n "${WORKERS:-14}")
  OUT="$OUTDIR" WARP_MESHAD_TEST_DEVICE=cuda:0 timeout "${TESTS_S:-540}" nice -n "${NICE:-0}" python3 -m pytest -q -rs \
    -p no:cacheprovider -p no:benchmark -p tools.gpu.pytest_outcomes "${xdist[@]}" "$@" > "$OUTDIR/gpu_tests.log" 2>&1
}
merge_test_logs() {
  # one file each for the workers' outcomes and failures: only a few files come back from a call
  for kind in outcomes fails; do
    if ls "$OUTDIR"/${kind}_*.txt >/dev/null 2>&1; then
      cat "$OUTDIR"/${kind}_*.txt > "$OUTDIR/$kind.txt" && rm -f "$OUTDIR"/${kind}_*.txt
    fi
  done
  tail -3 "$OUTDIR/gpu_tests.log"
  awk '{print $1}' "$OUTDIR/outcomes.txt" 2>/dev/null | sort | uniq -c
  sort -k3 -t' ' -rn "$OUTDIR/outcomes.txt" 2>/dev/null | head -8
  grep -h "^E  .*Error" "$OUTDIR/fails.txt" 2>/dev/null | sort | uniq -c | sort -rn | head -20
}
case "$stage" in
  tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUTDIR/gpu_info.txt"
    run_tests "$@"
    echo "tests rc $?"
    merge_test_logs
    ;;
  tests_pile)
    # the test suite (niced: mostly NVRTC compiles on the CPU) next to spot_pile, which resumes in a later `pile`
    # call; the test kernels compile fully optimized on CUDA (no per-thread local-memory reservation, see issue 2)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUTDIR/gpu_info.txt"
    NICE=10 run_tests "$@" &
    tests_pid=$!
    BENCH_OUT="$OUTDIR" timeout "${PILE_S:-570}" python3 -m benchmarks.shells_pile --steps "${STEPS:-20}" \
      --checkpoint /tmp/pile_ckpt > "$OUTDIR/pile.log" 2>&1
    echo "pile rc $?"
    wait $tests_pid
    echo "tests rc $?"
    grep -v "^\[" "$OUTDIR/pile.log" | tail -25
    merge_test_logs
    ;;
  cache)
    # the compiled kernels, to carry to a later machine (saves the NVRTC compiles: minutes for the shells)
    tar -cf - -C /tmp warpcache | xz -T8 -3 > "$OUTDIR/warpcache.tar.xz" && ls -la "$OUTDIR/warpcache.tar.xz"
    ;;
  pile)
    # spot_pile, resumable: a second call with the machine still warm continues after the last finished step
    BENCH_OUT="$OUTDIR" timeout "${PILE_S:-570}" python3 -m benchmarks.shells_pile --steps "${STEPS:-20}" \
      --checkpoint /tmp/pile_ckpt "$@" 2>&1 | tee "$OUTDIR/pile.log" | grep -v "^\[" | tail -30
    ;;
  bench)
    BENCH_OUT="$OUTDIR" python3 -m benchmarks.mass_spring "$@" 2>&1 | tee "$OUTDIR/bench_mass_spring.log"
    ;;
  bench19)
    # issue 19 probes (one process each): tet kernels (hand-written vs dual 12-variable vs F), the solver loop (host vs
    # device vs captured), the first call with a warm kernel cache (module records off, then on (the default) twice:
    # the first of those writes the records, the second reads them)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUTDIR/gpu_info.txt"
    BENCH_OUT="$OUTDIR" timeout "${TET_S:-240}" python3 -m benchmarks.tet_hand --sizes ${TET_SIZES:-27 56} > "$OUTDIR/tet_hand.log" 2>&1
    echo "tet_hand rc $?"; tail -25 "$OUTDIR/tet_hand.log"
    timeout "${LOOP_S:-150}" python3 -m benchmarks.solver_loop --device cuda:0 > "$OUTDIR/solver_loop.log" 2>&1
    echo "solver_loop rc $?"; tail -12 "$OUTDIR/solver_loop.log"
    { WARP_MESHAD_MODULE_RECORDS=0 timeout 120 python3 -m benchmarks.first_call --device cuda:0
      timeout 120 python3 -m benchmarks.first_call --device cuda:0
      timeout 120 python3 -m benchmarks.first_call --device cuda:0; } > "$OUTDIR/first_call.log" 2>&1
    echo "first_call rc $?"; grep '"benchmark"' "$OUTDIR/first_call.log" | cut -c1-600
    ;;
  bench20)
    # issue 20: the 200-patch dataset (made here, 14 processes), param one at a time vs batched on the GPU and with
    # Ray workers sharing it; then Ray with 1 vs 2 workers on the host's CPUs (patches of <= 5000 faces)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUTDIR/gpu_info.txt"
    [ -d /tmp/patches ] || python3 benchmarks/make_dataset.py --out /tmp/patches --jobs 14 > "$OUTDIR/make_dataset.log" 2>&1
    tail -2 "$OUTDIR/make_dataset.log"
    # from /tmp: Ray puts the driver's folder first on its workers' path, and the checkout's warp_meshad/ lacks the
    # kernels/ mapping of /tmp/pkg (Ray workers started from the checkout fail to import warp_meshad.kernels)
    (cd /tmp && BENCH_OUT="$OUTDIR" timeout "${BATCH_S:-330}" python3 -m benchmarks.batch_param --meshes /tmp/patches \
      --device cuda:0 --batch-sizes ${BATCH_SIZES:-200 50} --build-jobs ${BUILD_JOBS:-12} \
      --ray-workers ${RAY_WORKERS:-2 4} --runner-batch-size ${RUNNER_B:-50} ${EXTRA20:-}) > "$OUTDIR/batch_param_gpu.log" 2>&1
    echo "batch_param gpu rc $?"; grep -v "^Module\|^Warp\|^   " "$OUTDIR/batch_param_gpu.log" | tail -14 | cut -c1-400
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 BENCH_OUT="$OUTDIR" timeout "${CPU_S:-200}" python3 -m benchmarks.batch_param \
      --meshes /tmp/patches --device cpu --max-faces ${CPU_FACES:-5000} --ray-only --ray-workers 1 2 \
      --runner-batch-size 10 > "$OUTDIR/batch_param_cpu.log" 2>&1
    echo "batch_param cpu rc $?"; grep -v "^Module\|^Warp\|^   " "$OUTDIR/batch_param_cpu.log" | tail -6 | cut -c1-400
    ;;
  factorizations)
    # issue 19: cuDSS's factorization/solve algorithms and ND levels on the apps' systems, then elastic/bunny and
    # param/bunny_cut as first_step runs them, default and with each system's fastest config (WARP_MESHAD_CUDSS_CONFIG)
    timeout "${FACT_S:-150}" python3 -m benchmarks.cudss_calls --factorizations > "$OUTDIR/factorizations.jsonl" \
      2> "$OUTDIR/factorizations.err"
    python3 -m benchmarks.cudss_calls_best "$OUTDIR/factorizations.jsonl" | tee "$OUTDIR/best_configs.txt"
    for scene in elastic/bunny param/bunny_cut; do
      best=$(grep "^$scene " "$OUTDIR/best_configs.txt" | cut -d' ' -f3-)
      for run in ${FACT_RUNS:-cold default best default best}; do
        [ "$run" = best ] && export WARP_MESHAD_CUDSS_CONFIG="$best" || unset WARP_MESHAD_CUDSS_CONFIG
        timeout 100 python3 -m benchmarks.first_step "$scene" --top 0 > /tmp/fs.txt 2>&1
        head -1 /tmp/fs.txt >> "$OUTDIR/factorizations_apps.jsonl"
        python3 -c "import json,sys; d=json.loads(open('/tmp/fs.txt').readline()); print(sys.argv[1], sys.argv[2], sys.argv[3], 'run_ms', d['run_ms'], 'step0', round(d['step0']['wall_ms'],1), 'later', d['later_median_wall_ms'], 'graph', d['later_phases_median_ms'].get('graph'), 'its', d['iterations'], 'E', d['final_energy'])" "$scene" "$run" "$best" 2>&1 | tail -1
      done
      unset WARP_MESHAD_CUDSS_CONFIG
    done
    ;;
  apps19)
    # issue 19 item 2's app targets, as a user runs them: each scene twice (the first fills the kernel cache), the
    # second's solve time (param: solve_seconds; elastic: the run) and iterations from metrics.json
    for scene in param/armadillo param/bunny_cut elastic/bunny; do
      for run in cold warm; do
        out="/tmp/apps19/${scene//\//_}_$run"
        timeout "${APP_S:-150}" python3 -m warp_meshad run "$scene" --device cuda:0 --headless --quiet --output "$out" \
          > "$OUTDIR/apps19_${scene//\//_}_$run.log" 2>&1
        python3 -c "import json,sys; m=json.load(open(sys.argv[1])); t=m['time_ms']; r=m.get('per_step') or [{}]; print(sys.argv[2], sys.argv[3], 'solve_s', m.get('solve_seconds'), 'run_ms', round(t.get('run',0)), 'compile_ms', round(t.get('compile',0)), 'iterations', m['iterations'], 'E', m['final_energy'], 'E/A', m.get('energy_per_area'), 'check', m.get('check_final'), 'reasons', sorted(set(x.get('reason') for x in r)), 'fallbacks', m.get('steepest_descent_fallbacks'))" \
          "$out/metrics.json" "$scene" "$run" 2>&1 | tee -a "$OUTDIR/apps19.txt"
      done
    done
    ;;
  apps_loops)
    # issue 19 item 2: elastic/bunny from an empty kernel cache (its own; COLD=0 skips it), then each app scene
    # (SCENES) with the host loop, the device loop and the captured device loop (LOOPS; warm: the host-loop run
    # before fills the cache); per run the solve time, the solver's phases, the compile time, iterations and E
    summary() {  # metrics.json -> one line
      python3 -c "import json,sys; m=json.load(open(sys.argv[1])); t=m['time_ms']; r=m.get('per_step') or [{}]; print(*sys.argv[2:], 'solve_s', m.get('solve_seconds'), 'run_ms', round(t.get('run',0)), 'setup_ms', round(t.get('setup',0)), 'compile_ms', round(t.get('compile',0)), 'deriv_ms', round(t.get('solver_derivatives',0)), 'linear_ms', round(t.get('solver_linear_solve',0)), 'ls_ms', round(t.get('solver_line_search',0)), 'iterations', m['iterations'], 'E', m['final_energy'], 'E/A', m.get('energy_per_area'), 'check', m.get('check_final'), 'reasons', sorted(set(x.get('reason') for x in r)), 'fallbacks', m.get('steepest_descent_fallbacks'))" "$@" 2>&1 | tee -a "$OUTDIR/apps_loops.txt"
    }
    start=$(date +%s.%N)
    [ "${COLD:-1}" = 0 ] || WARP_CACHE_PATH=/tmp/coldcache WARP_MESHAD_CACHE_PATH=/tmp/coldcache/gen timeout 300 python3 -m warp_meshad run \
      elastic/bunny --device cuda:0 --headless --quiet --output /tmp/apps/cold_elastic > "$OUTDIR/cold_elastic.log" 2>&1
    [ "${COLD:-1}" = 0 ] || echo "elastic/bunny from an empty cache: rc $? wall_s $(python3 -c "import time; print(round(time.time() - $start, 2))")" | tee -a "$OUTDIR/apps_loops.txt"
    [ "${COLD:-1}" = 0 ] || summary /tmp/apps/cold_elastic/metrics.json elastic/bunny cold_cache
    # EXTRA: more `--set key=value` words for every run (e.g. EXTRA="pin_vertex=null")
    extra=(); for kv in ${EXTRA:-}; do extra+=(--set "$kv"); done
    for scene in ${SCENES:-param/armadillo param/bunny_cut elastic/bunny}; do
      run=0
      for loop in ${LOOPS:-false false true capture capture}; do
        run=$((run + 1))
        tag="${EXTRA:-}"; tag="${tag// /_}"; tag="${tag//=/-}"
        out="/tmp/apps/${scene//\//_}_${loop}_$run${tag:+_$tag}"  # one folder per run and EXTRA: a failed run's metrics stay
        timeout "${APP_S:-150}" python3 -m warp_meshad run "$scene" --device cuda:0 --headless --quiet --output "$out" \
          --set device_loop=$loop "${extra[@]}" > "$OUTDIR/apps_${scene//\//_}_${loop}_$run${tag:+_$tag}.log" 2>&1 || tail -5 "$OUTDIR/apps_${scene//\//_}_${loop}_$run${tag:+_$tag}.log"
        summary "$out/metrics.json" "$scene" "device_loop=$loop" ${EXTRA:-}
      done
    done
    ;;
  gc)
    # Python's generation-2 collections in the apps' first step, without and with gc.freeze() before the
    # steps (what run_app does), alternated, one process each; then cuSOLVER's dense Cholesky (CuPy only)
    for scene in ${GC_SCENES:-elastic/bunny param/bunny_cut param/armadillo}; do
      for flag in "" --gc-freeze "" --gc-freeze; do
        timeout 100 python3 -m benchmarks.first_step "$scene" --top 0 $flag > /tmp/fs.txt 2>&1
        head -1 /tmp/fs.txt >> "$OUTDIR/gc.jsonl"
        python3 -c "import json,sys; d=json.loads(open('/tmp/fs.txt').readline()); print(sys.argv[1], 'freeze', d['gc_freeze'], 'gc_step0', d['gc_step0'], 'gc_run_ms', d['gc_run']['ms'], 'run_ms', d['run_ms'], 'step0', round(d['step0']['wall_ms'],1), 'later', d['later_median_wall_ms'], 'its', d['iterations'], 'E', d['final_energy'])" "$scene" 2>&1 | tail -1 | tee -a "$OUTDIR/gc.txt"
      done
    done
    for keep in false true false true; do  # elastic's keep_start_factors (one factorization less per step)
      timeout 100 python3 -m benchmarks.first_step elastic/bunny --top 0 --gc-freeze --set keep_start_factors=$keep \
        > /tmp/fs.txt 2>&1
      head -1 /tmp/fs.txt >> "$OUTDIR/gc.jsonl"
      python3 -c "import json,sys; d=json.loads(open('/tmp/fs.txt').readline()); print('elastic/bunny keep_start_factors', sys.argv[1], 'run_ms', d['run_ms'], 'step0', round(d['step0']['wall_ms'],1), 'later', d['later_median_wall_ms'], 'its', d['iterations'], 'E', d['final_energy'])" "$keep" 2>&1 | tail -1 | tee -a "$OUTDIR/gc.txt"
    done
    timeout "${DENSE_S:-120}" python3 -m benchmarks.dense_cholesky --float32 > "$OUTDIR/dense_cholesky.jsonl" 2>&1
    echo "dense_cholesky rc $?"; cut -c1-300 "$OUTDIR/dense_cholesky.jsonl"
    ;;
  keep)
    # elastic's keep_start_factors with the kept slot captured as its own graph (off / on alternated,
    # first_step then the app as a user runs it); then param with and without hessian_shift (Cholesky without a pin)
    for keep in false true false true; do
      timeout 100 python3 -m benchmarks.first_step elastic/bunny --top 0 --set keep_start_factors=$keep > /tmp/fs.txt 2>&1
      head -1 /tmp/fs.txt >> "$OUTDIR/keep.jsonl"
      python3 -c "import json,sys; d=json.loads(open('/tmp/fs.txt').readline()); print('elastic/bunny keep_start_factors', sys.argv[1], 'run_ms', d['run_ms'], 'step0', round(d['step0']['wall_ms'],1), 'later', d['later_median_wall_ms'], d['later_phases_median_ms'], 'its', d['iterations'], 'E', d['final_energy'])" "$keep" 2>&1 | tail -1 | tee -a "$OUTDIR/keep.txt"
    done
    for extra in "keep_start_factors=false" "keep_start_factors=true" "keep_start_factors=false" "keep_start_factors=true"; do
      COLD=0 SCENES=elastic/bunny LOOPS="capture capture" EXTRA="$extra" bash "$0" apps_loops > /dev/null 2>&1
    done
    for extra in "" "hessian_shift=1e-8" "" "hessian_shift=1e-8"; do
      COLD=0 SCENES="param/armadillo param/bunny_cut" LOOPS="capture capture" EXTRA="$extra" bash "$0" apps_loops \
        > /dev/null 2>&1
    done
    cat "$OUTDIR/apps_loops.txt" >> "$OUTDIR/keep.txt"; rm -f "$OUTDIR"/apps_*.log "$OUTDIR/apps_loops.txt"
    cut -c1-420 "$OUTDIR/keep.txt"
    ;;
  symmetric)
    # cuDSS's symmetric indefinite LDL^T (matrix_type=symmetric) for param's unpinned projected Hessian,
    # against the LU it gets now; first_step, captured loop, alternated after one warm-up run per scene
    for scene in ${SCENES:-param/armadillo param/bunny_cut}; do
      for linear in warmup general symmetric general symmetric general symmetric; do
        flag=(); [ "$linear" = symmetric ] && flag=(--linear matrix_type=symmetric)
        timeout 100 python3 -m benchmarks.first_step "$scene" --top 0 "${flag[@]}" > /tmp/fs.txt 2>&1
        head -1 /tmp/fs.txt >> "$OUTDIR/symmetric.jsonl"
        python3 -c "import json,sys; d=json.loads(open('/tmp/fs.txt').readline()); print(sys.argv[1], sys.argv[2], d['matrix_type'], 'run_ms', d['run_ms'], d['step0']['time_ms'], 'its', d['iterations'], 'E', d['final_energy'])" "$scene" "$linear" 2>&1 | tail -1 | tee -a "$OUTDIR/symmetric.txt"
      done
    done
    ;;
  pack)
    # a call returns at most 8 files from $OUT: run the given stage with its files in a scratch folder, then pack
    # them into one archive (`bash tools/gpu/remote.sh pack bench20`)
    OUT=/tmp/pack_out bash "$0" "$@"
    echo "stage rc $?"
    tar -czf "$OUTDIR/pack.tgz" -C /tmp pack_out && ls -la "$OUTDIR/pack.tgz"
    ;;
  analyses)
    # issue 20: cuDSS's analyses of 50 patches one after the other, on one shared handle, then in thread pools (4
    # threads once crashed the process: the pools run last)
    [ -d /tmp/patches ] || python3 benchmarks/make_dataset.py --out /tmp/patches --jobs 14 > "$OUTDIR/make_dataset.log" 2>&1
    timeout "${ANALYSES_S:-300}" python3 -m benchmarks.cudss_calls --patches /tmp/patches --threads ${THREADS:-4 8 16} \
      > "$OUTDIR/analyses.log" 2>&1
    echo "analyses rc $?"; grep -v "^Module\|^Warp\|^   " "$OUTDIR/analyses.log" | tail -8 | cut -c1-400
    ;;
  cudss_direct)
    # issue 19 item 2: nvmath's calls against direct cuDSS calls, capturing a solve in a CUDA graph, the analysis cache
    timeout "${DIRECT_S:-240}" python3 -m benchmarks.cudss_direct > "$OUTDIR/cudss_direct.log" 2>&1
    echo "cudss_direct rc $?"; grep -v "^Module\|^Warp\|^   " "$OUTDIR/cudss_direct.log" | grep "^{" | cut -c1-1500
    ;;
  newton_tet)
    # issue 19 item 3: the 1M-tet statics with cuDSS's options (its log in a file of its own: a call returns at most 8 files)
    BENCH_OUT="$OUTDIR" timeout "${TET_S:-540}" python3 -m benchmarks.newton_tet "$@" > "$OUTDIR/newton_tet.log" 2>&1
    echo "newton_tet rc $?"; grep -v "^Module\|^Warp" "$OUTDIR/newton_tet.log" | tail -40
    ;;
  --)
    "$@" 2>&1 | tee "$OUTDIR/cmd.log"
    ;;
esac
