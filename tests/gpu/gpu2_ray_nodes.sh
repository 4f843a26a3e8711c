#!/usr/bin/env bash
# Two Ray nodes on one host, one GPU each, and a GRPO job submitted to them (docs/ray_cluster.md, "Two nodes on one
# machine"):
#
#   bash tests/gpu/gpu2_ray_nodes.sh          # 2 GPUs: ~3 min; a table last
#   bash tests/gpu/gpu2_ray_nodes.sh --cpu    # the same flow on the CPU (one worker slot per node, gloo)
#
# 1. `ray start --head --num-gpus=1` with CUDA_VISIBLE_DEVICES=0, then `ray start --address=<head> --num-gpus=1`
#    with CUDA_VISIBLE_DEVICES=1: two raylets on 127.0.0.1, each with its own --temp-dir, free ports, token
#    authentication with a token of this run (RAY_AUTH_MODE=token; `ray` CLI calls get it from the environment).
# 2. `ray job submit --working-dir .` of the quickstart job (tiny Qwen2, synthetic digits, GRPO, vLLM) with
#    trainer.nnodes=2 trainer.n_gpus_per_node=1, NCCL_DEBUG=VERSION; followed until it ends. Without the job API
#    (the dashboard needs ray[default]'s packages: aiohttp_cors, opencensus, opentelemetry-exporter-prometheus,
#    pydantic, ...) the driver joins the same cluster directly instead: ray_init.address=<head>.
# 3. A table: the job's status, the node of each rank, the validation reward first -> last, how many worker
#    processes ran NCCL (NCCL_DEBUG=VERSION: each prints its version once it makes a communicator). Then both nodes
#    are stopped: SIGTERM to each `ray start --block` (what `ray stop` does,
#    limited to this cluster: `ray stop` would also stop any other Ray of the machine).
#
# Needs Ray, rlx's dependencies and (on GPUs) vLLM importable by $PYTHON (default: .venv); `ray` is run as
# `$PYTHON -m ray.scripts.scripts`. STEPS (default 10) training steps; JOB_API=0 takes the direct-driver path even
# where the job API answers. Exits non-zero when the job did not succeed (after the table).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
RAY=("$PYTHON" -m ray.scripts.scripts)
CPU=0
[ "${1:-}" = --cpu ] && CPU=1
STEPS="${STEPS:-10}"
TMP="$(mktemp -d /tmp/rlxrn.XXXXXX)"  # short: Ray's unix socket paths must stay under 108 characters
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=0
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$("$PYTHON" -c 'import secrets; print(secrets.token_hex(32))')"
export NCCL_DEBUG=VERSION  # each rank's NCCL prints its version once (the raylets pass it on to the workers)
unset RAY_ADDRESS
read -r GCS DASH CLIENT AGENT1 AGENT2 <<< "$("$PYTHON" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)"
t0=$SECONDS
NODES=()

stop_nodes() {
  for pid in "${NODES[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${NODES[@]}"; do
    for _ in $(seq 45); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null  # what is left of that node's own process group
  done
}
trap stop_nodes EXIT

start_node() {  # start_node LOG GPU ARGS...: `ray start --block` in a process group of its own; waits until it is up
  local log="$1" gpu="$2"; shift 2
  if [ $CPU = 1 ]; then
    setsid "${RAY[@]}" start --block --node-ip-address=127.0.0.1 --disable-usage-stats --num-gpus=0 --num-cpus=1 \
      "$@" > "$log" 2>&1 &
  else
    CUDA_VISIBLE_DEVICES="$gpu" setsid "${RAY[@]}" start --block --node-ip-address=127.0.0.1 --disable-usage-stats \
      --num-gpus=1 --num-cpus=4 "$@" > "$log" 2>&1 &
  fi
  NODES+=($!)
  for _ in $(seq 120); do
    grep -q "Ray runtime started" "$log" && return 0
    kill -0 "${NODES[-1]}" 2>/dev/null || break
    sleep 1
  done
  echo "the Ray node did not start ($log):" >&2
  tail -n 30 "$log" >&2
  exit 1
}

echo "=== two Ray nodes on 127.0.0.1 ($TMP)"
start_node "$TMP/head.log" 0 --head "--port=$GCS" --dashboard-host=127.0.0.1 "--dashboard-port=$DASH" \
  --include-dashboard=true "--ray-client-server-port=$CLIENT" "--dashboard-agent-listen-port=$AGENT1" \
  "--temp-dir=$TMP"
mkdir -p "$TMP/n1"  # a temp dir of its own: the job's working dir is unpacked per node
start_node "$TMP/node1.log" 1 "--address=127.0.0.1:$GCS" "--dashboard-agent-listen-port=$AGENT2" "--temp-dir=$TMP/n1"
for _ in $(seq 30); do  # the cluster's view catches up with the second node within seconds
  "${RAY[@]}" status "--address=127.0.0.1:$GCS" > "$TMP/status_nodes.log" 2>&1
  [ "$(grep -c " node_" "$TMP/status_nodes.log")" -ge 2 ] && break
  sleep 1
done
grep -E " node_|GPU|CPU" "$TMP/status_nodes.log" | head -n 8

JOB=(--config-name quickstart trainer.nnodes=2 trainer.n_gpus_per_node=1 "trainer.total_training_steps=$STEPS"
     trainer.test_freq=5 trainer.save_freq=-1 "trainer.logger=[console,file]" "trainer.default_local_dir=$TMP/out")
if [ $CPU = 1 ]; then
  JOB+=(trainer.device=cpu actor_rollout_ref.rollout.name=hf data.train_batch_size=4
        actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
        data.val_files=synthetic://digits/size:8/seed:1)
else
  JOB+=(trainer.device=cuda actor_rollout_ref.rollout.name=vllm)
fi

# the job API answers once the dashboard is up (not at all without ray[default]'s packages)
api=0
[ "${JOB_API:-1}" = 0 ] || for _ in $(seq 60); do
  if "$PYTHON" - "$DASH" <<'EOF' 2>/dev/null; then api=1; break; fi
import os, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/api/version",
                             headers={"Authorization": f"Bearer {os.environ['RAY_AUTH_TOKEN']}"})
sys.exit(0 if urllib.request.urlopen(req, timeout=5).status == 200 else 1)
EOF
  sleep 1
done

t1=$SECONDS
if [ $api = 1 ]; then
  echo "=== ray job submit (the job API at http://127.0.0.1:$DASH)"
  RUNTIME_ENV="$("$PYTHON" - "$CPU" <<'EOF'
import json, sys, yaml
env = yaml.safe_load(open("scripts/runtime_env.yaml"))
# folders git ignores here (carried packages, data, outputs) are not the job's code: not uploaded
env["excludes"] += [line.strip() for line in open(".gitignore") if line.strip().endswith("/")]
if sys.argv[1] == "1":
    env["env_vars"].update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
print(json.dumps(env))
EOF
)"
  id="rlx-two-nodes-$$"
  "${RAY[@]}" job submit "--address=http://127.0.0.1:$DASH" "--submission-id=$id" --working-dir=. \
    "--runtime-env-json=$RUNTIME_ENV" --no-wait -- "$PYTHON" -m rlx.trainer.main_ppo "${JOB[@]}" \
    > "$TMP/submit.log" 2>&1
  timeout 480 "${RAY[@]}" job logs "--address=http://127.0.0.1:$DASH" --follow "$id" > "$TMP/job.log" 2>&1
  "${RAY[@]}" job status "--address=http://127.0.0.1:$DASH" "$id" > "$TMP/status.log" 2>&1
  status="$(grep -oE "Job '[^']+' (succeeded|failed|stopped)" "$TMP/status.log" | tail -n 1)"
  how="ray job submit"
else
  echo "=== no job API (JOB_API=0, or the dashboard's packages are missing): the driver joins with ray_init.address"
  NCCL_DEBUG=VERSION timeout 480 "$PYTHON" -m rlx.trainer.main_ppo "${JOB[@]}" "ray_init.address=127.0.0.1:$GCS" \
    > "$TMP/job.log" 2>&1
  rc=$?
  status="driver exit $rc"
  how="driver with ray_init.address"
fi
[ -n "${status:-}" ] || status="unknown: $(tail -n 3 "$TMP/status.log" 2>/dev/null)"
case "$status" in *succeeded*|"driver exit 0") ;; *) tail -n 40 "$TMP/job.log" | sed "s/^/    | /" ;; esac

echo
echo "### two Ray nodes on one host ($([ $CPU = 1 ] && echo "CPU, gloo" || echo "1 GPU each, NCCL")), $how"
"$PYTHON" - "$TMP" "$status" $((SECONDS - t1)) <<'EOF'
import glob, json, os, re, sys
tmp, status, seconds = sys.argv[1], sys.argv[2], sys.argv[3]
log = open(os.path.join(tmp, "job.log"), errors="replace").read()
placement = re.search(r"ActorRolloutRefWorker: \d+ ranks, rendezvous (\S+), rank -> \(bundle, node\): (.*)", log)
nodes = re.findall(r"(\d+)->\(\d+, (\w+)\)", placement.group(2)) if placement else []
metrics = os.path.join(tmp, "out", "logs", "metrics.jsonl")
records = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
steps = [r for r in records if "timing_s/step" in r]
vals = [r["val/synthetic/digits/reward/mean"] for r in records if "val/synthetic/digits/reward/mean" in r]
nccl = set()  # the worker logs (of both nodes' temp dirs) in which a rank's NCCL printed its version
for path in glob.glob(os.path.join(tmp, "**", "logs", "worker-*.out"), recursive=True):
    version = next((line.strip() for line in open(path, errors="replace") if "NCCL version" in line), None)
    if version:
        nccl.add((os.path.basename(path), version[version.index("NCCL version"):]))
rows = [("job", f"{status} in {seconds} s"),
        ("ranks -> node", ", ".join(f"rank {r} on {n[:8]}" for r, n in nodes) or "not found in the log"),
        ("ranks on distinct nodes", str(len({n for _, n in nodes}) == 2)),
        ("training steps", str(len(steps))),
        ("validation reward", " -> ".join(f"{v:.3f}" for v in (vals[0], vals[-1])) if vals else "-"),
        ("median step s", f"{sorted(r['timing_s/step'] for r in steps)[len(steps) // 2]:.2f}" if steps else "-"),
        ("workers that ran NCCL", f"{len(nccl)}" + (f" ({sorted({v for _, v in nccl})[0]})" if nccl else ""))]
width = max(len(k) for k, _ in rows)
for k, v in rows:
    print(f"{k:<{width}}  {v}")
EOF
echo "($((SECONDS - t0)) s in all; logs in $TMP)"
case "$status" in  # the table shows what ran; the exit status says whether the job succeeded
  *succeeded*|"driver exit 0") ;;
  *) echo "gpu2_ray_nodes: the job did not succeed ($status)" >&2; exit 1 ;;
esac
