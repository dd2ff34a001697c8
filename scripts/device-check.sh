#!/usr/bin/env bash
# The checks only a GPU machine can make, as one short script (a few minutes):
#
#   1. the executor on CUDA/NCCL: real runs with the gradient check (device
#      events time every op), a text-only 1F1B and a transpose with a
#      trainable ViT (parameter broadcast + gradient all-reduce over NCCL);
#      with two GPUs also dp=2 with ZeRO-1 and tp=2 with sequence parallelism;
#   2. `mpipe profile` of a model on CUDA, and the workload it writes evaluated;
#   3. a real torch.distributed.pipelining run on CUDA traced by torch.profiler
#      with CUDA activity (device-side `gpu_user_annotation` ranges), from
#      Mpipe's own `--format torchtitan` export, then `mpipe import-trace` of
#      its per-rank traces, `compare-run` and `calibrate` on the imported run;
#   4. `mpipe run --profile` on CUDA (Kineto traces with device-side ranges of
#      the executor's own mpipe: labels) and `mpipe import-trace` of them: the
#      run reads back as its own term.  (On NPU the same option writes
#      torch_npu's *_ascend_pt folders; there is no NPU case here.)
#
#   bash scripts/device-check.sh [OUT_DIR]     (default $OUT, else test-output/device-check)
#   DEVICE_CHECK_ON=cpu bash scripts/device-check.sh   (the same steps on gloo/CPU: checks the script)
#
# Runs with the machine's own python3 and torch (CUDA build); Mpipe itself is
# taken from this checkout (PYTHONPATH).  Pure-Python needs the image may lack
# (lark, SQLAlchemy, Alembic, ...) can travel as wheels in .whl/ (fetched here
# by scripts/device-wheels.sh).  One GPU runs one rank per term (NCCL wants a
# GPU per rank); two or more GPUs run two ranks.  Every step prints what it
# ran; the script stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-test-output/device-check}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
site=/tmp/mpipe-device-site
if ! "$py" -c "import lark, sqlalchemy, alembic" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
    export PYTHONPATH="$site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 MPIPE_DB_URL="sqlite:///$out/device-check.db"
mpipe() { "$py" -m mpipe_cli.main "$@"; }
step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

on=${DEVICE_CHECK_ON:-cuda}
step "what this machine has"
if [ "$on" = cpu ]; then
    backend=gloo device=cpu p=2
    echo "DEVICE_CHECK_ON=cpu: the same steps on gloo and the CPU (this checks the script, not a GPU)"
else
    backend=nccl device=cuda
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    gpus=$("$py" -c 'import torch; print(torch.__version__, torch.cuda.device_count())')
    echo "torch $gpus"
    count=${gpus##* }
    [ "$count" -ge 1 ] || { echo "device-check: torch sees no CUDA device" >&2; exit 1; }
    p=$(( count >= 2 ? 2 : 1 ))
fi

step "1. executor on $device/$backend, $p rank(s), --check-grads"
if [ "$p" -ge 2 ]; then
    terms=("1f1b(p=2, m=4)" "transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)")
    models=("tiny-text" "tiny")
else
    terms=("1f1b(p=1, m=4)" "interleaved(p=1, m=4)")
    models=("tiny-text" "tiny")
fi
for i in "${!terms[@]}"; do
    mpipe run "${terms[$i]}" --model "${models[$i]}" --backend "$backend" --nproc "$p" --steps 2 --check-grads \
        --json > "$out/run-$i.json"
    "$py" - "$out/run-$i.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
check = doc.get("grad_check") or {}
print(f"  {doc['term']} on {doc['devices']} x {doc['backend']}: measured makespan {doc['makespan']} "
      f"{doc['makespan_unit']}, predicted {doc['predicted_makespan']} {doc['predicted_unit']}; grad check "
      f"ok={check.get('ok')}, max abs error {check.get('max_abs_error')}, max rel error "
      f"{check.get('max_rel_error')}, loss error {check.get('loss_error')}")
sys.exit(0 if check.get("ok") else 1)
PY
done

# A two-rank layout run (NCCL wants a GPU per rank, so one GPU skips it): LABEL MODEL PARALLEL.
layout_run() {
    local label=$1 model=$2 parallel=$3
    if [ "$p" -lt 2 ]; then
        echo "  skipped: $label over $backend needs two GPUs (NCCL wants a GPU per rank); this machine has one"
        return
    fi
    mpipe run "1f1b(p=1, m=4)" --model "$model" --parallel "$parallel" --backend "$backend" \
        --nproc 2 --steps 2 --check-grads --json > "$out/run-$label.json"
    "$py" - "$out/run-$label.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
check = doc.get("grad_check") or {}
print(f"  {doc['term']} layout {doc['layout']} on {doc['devices']} x {doc['backend']}: grad check "
      f"ok={check.get('ok')}, max rel error {check.get('max_rel_error')}, loss error {check.get('loss_error')}")
sys.exit(0 if check.get("ok") else 1)
PY
}

step "1b. data parallelism on $device/$backend: dp=2 with ZeRO-1 (reductions on the process grid's mesh groups)"
layout_run dp2 tiny-text dp=2,distributed_optimizer

step "1c. tensor and sequence parallelism on $device/$backend: tp=2 sp (DTensor on the mesh's tp group)"
layout_run tp2 tiny tp=2,sp

step "2. mpipe profile on $device"
mpipe profile --model tiny --device "$device" -o "$out/profile-$device.json"
mpipe eval "1f1b(p=2, m=4)" -w "$out/profile-$device.json"

step "3. torch pipelining on $device under torch.profiler, then import-trace"
term="interleaved(p=$p, m=4)"
echo '{"llm": {"layers": 4}}' > "$out/layers4.json"
mpipe export "$term" -w "$out/layers4.json" --format torchtitan -o "$out/torchtitan"
mkdir -p "$out/traces"
if [ "$device" = cuda ]; then width=1024 seq=256; else width=128 seq=32; fi  # a few ms per op on either
cat > "$out/spec.json" <<JSON
{"layers": 4, "d": $width, "vocab": $width, "seq": $seq, "batch": 4, "windows": 3, "active": 1, "warmup": 0,
 "backend": "$backend", "device": "$device",
 "cases": [{"name": "$device", "toml": "$out/torchtitan/torchtitan.toml", "out": "$out/traces",
            "order": "$out/torch_order.json", "microbatches": 4}]}
JSON
"$py" -m torch.distributed.run --standalone --nproc-per-node "$p" --max-restarts 0 \
    tests/mpipe_cli/torch_trace_job.py "$out/spec.json"
mpipe import-trace "$out/traces" --term "$term" --workload "$out/layers4.json" --json > "$out/import.json"
run=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$out/import.json")
"$py" - "$out/import.json" "$device" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"  imported run {doc['id']}: ops per rank {doc['ops_per_rank']}, {len(doc['steps'])} step(s), "
      f"device-side ranges: {doc['device_side']}; clock: {doc['clock']}")
on_gpu = sys.argv[2] == "cuda"
sys.exit(0 if doc["device_side"] == on_gpu else 1)  # a CUDA trace must give the device's own times
PY
mpipe runs show "$run" | sed -n 1,20p
mpipe compare-run "$run" --against "$term"
mpipe calibrate "$run" -o "$out/calibrated.json"

step "4. mpipe run --profile on $device/$backend, then import-trace of its own traces"
term4="1f1b(p=$p, m=4)"
rm -rf "$out/profiled"
mpipe run "$term4" --model tiny-text --backend "$backend" --nproc "$p" --steps 2 --profile "$out/profiled" \
    --json > "$out/run-profiled.json"
mpipe import-trace "$out/profiled" --json > "$out/import-profiled.json"
"$py" - "$out/run-profiled.json" "$out/import-profiled.json" "$device" "$term4" <<'PY'
import json, sys
imp, device, term = json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4]
print(f"  imported run {imp['id']}: {imp['term']}, ops per rank {imp['ops_per_rank']}, device-side ranges: "
      f"{imp['device_side']}")
ok = imp["term"] == term and imp["device_side"] == (device == "cuda")
sys.exit(0 if ok else 1)  # the executor's own run reads back as its term, with device times on CUDA
PY
echo
echo "device-check: all steps passed; outputs in $out"
