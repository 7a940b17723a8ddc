#!/usr/bin/env bash
# One device call: carried wheels, then any of (each optional, each bounded by its timeout):
#   PYTEST=1            the device tests: kernels, engine, the model's graph paths (no network e2e);
#                       PYTEST_FILES="tests/a tests/b.py" runs only those
#   CHECK="--full"      graph-backend parity (tiny, and with --full the full model), graph vs eager
#   STAGES="8,32,64,96" per-stage graph timings, whole beats on one stream and on five, and the
#                       top kernels of each stage at KERNELS (64) sessions (eager and inside the
#                       replay); STAGES_ARGS="--profile dense" passes more options
#   FIDELITY=1          the teacher-forced fidelity harness, full config, both profiles
#   "$1" "$2" ...       the capacity bench with each argument string in turn, on BACKEND (default
#                       graph), each bounded by BENCH_TIMEOUT, its JSON under $OUT/benchN/
# The GPU machine lacks pyzmq, soxr, soundfile (with cffi, pycparser) and websockets: carry their
# cp312 manylinux wheels in .whl/ (`pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 ... -d .whl NAME`).
# Usage: `python -m wave_actors.bench.provenance write` here (the device's copy has no .git, or a stale
# one; the results name the commit from this manifest, checked file by file), carry
# .wave-manifest.json with the call, then on the device machine:
#   PYTEST=1 STAGES=8,32,64,96 bash bench/device_graph.sh "<bench args>"
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee $OUT/nvsmi.txt
if [ -n "$PYTEST" ]; then
  timeout ${PYTEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider ${PYTEST_FILES:-tests/kernels tests/engine \
    tests/model/test_model_voicechat.py} \
    2>&1 | tee $OUT/pytest.log | tail -4
fi
if [ -n "$CHECK" ]; then
  timeout ${CHECK_TIMEOUT:-240} python3 bench/graph_check.py --out $OUT/graph-check.json $CHECK 2>&1 | tee $OUT/check.log | grep -v "^  " | tail -25
fi
if [ -n "$STAGES" ]; then
  timeout ${STAGES_TIMEOUT:-200} python3 bench/graph_stages.py --sessions $STAGES --kernels ${KERNELS:-64} --beat $STAGES_ARGS \
    --out $OUT/graph-stages.json 2>&1 | tee $OUT/stages.log | grep -v "Warn" | tail -60
fi
if [ -n "$FIDELITY" ]; then
  for p in reference dense; do
    timeout ${FIDELITY_TIMEOUT:-150} python3 bench/fidelity.py --config full --profile $p --sessions 8 \
      --frames 32 --out $OUT/fidelity-$p.json 2>&1 | tee $OUT/fidelity-$p.log | tail -14
  done
fi
i=0
for args in "$@"; do
  i=$((i + 1))
  echo "== bench $i: $args"
  timeout ${BENCH_TIMEOUT:-300} python3 -m wave_actors.bench --backend ${BACKEND:-graph} --out $OUT/bench$i $args 2>&1 | tee $OUT/bench$i.log | grep -v "out of context\|held back" | tail -${BENCH_TAIL:-25}
done
