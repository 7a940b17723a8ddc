#!/usr/bin/env bash
# One device call: carried wheels, graph-backend parity (tiny and full), then the capacity bench.
# Usage on the device machine: bash bench/device_graph.sh "<bench args>"
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee $OUT/nvsmi.txt
if [ -n "$CHECK" ]; then
  timeout ${CHECK_TIMEOUT:-240} python3 bench/graph_check.py --out $OUT/graph-check.json $CHECK 2>&1 | tee $OUT/check.log | grep -v "^  " | tail -25
fi
if [ -n "$1" ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 -m wave_actors.bench --backend graph --out $OUT $1 2>&1 | tee $OUT/bench.log | tail -25
fi
