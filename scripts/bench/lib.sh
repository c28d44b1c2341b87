# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared by the scripts in scripts/bench (sourced, not run).
# Starts the local server (moto through src/local/serve.py, as the tests and the
# demo run it) on a free port and stops it on exit.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$ROOT/.tools/venv/bin/python"
REKEY="${REKEY:-$ROOT/target/release/rekey}"  # or the binary named by $REKEY
BENCH="$ROOT/scripts/bench"

[[ -x "$REKEY" ]] || { echo "no $REKEY: run cargo build --release" >&2; exit 1; }
[[ -x "$PY" ]] || { echo "no $PY: run scripts/install-deps" >&2; exit 1; }
[[ -x "$ROOT/.tools/venv/bin/moto_server" ]] || { echo "no moto_server: run scripts/install-deps" >&2; exit 1; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/rekey-bench.XXXXXX")"
DDB_PID=""

cleanup() {
  if [[ -n "$DDB_PID" ]]; then
    kill "$DDB_PID" 2>/dev/null || true
    wait "$DDB_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_ddb: starts the local server, waits (at most 60 s) until DynamoDB
# answers, and exports the AWS_* variables rekey and boto3 read.
start_ddb() {
  local port
  port="$(free_port)"
  "$PY" -c "$(cat "$ROOT/src/local/serve.py")" -H 127.0.0.1 -p "$port" >"$WORK/ddb.log" 2>&1 &
  DDB_PID=$!
  export AWS_ENDPOINT_URL="http://127.0.0.1:$port"
  export AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
  local i
  for i in $(seq 1 120); do
    if "$PY" -c 'import boto3, os; boto3.client("dynamodb", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).list_tables()' 2>/dev/null; then
      return 0
    fi
    kill -0 "$DDB_PID" 2>/dev/null || { cat "$WORK/ddb.log" >&2; echo "the local server exited" >&2; exit 1; }
    sleep 0.5
  done
  echo "the local server did not answer within 60 s" >&2
  exit 1
}

# plan_for SOURCE TARGET: plans/tenant-day-shard.toml with the table names replaced.
plan_for() {
  local out="$WORK/plan-$2.toml"
  sed -e "s/^table = \"orders\"$/table = \"$1\"/" -e "s/^table = \"orders_by_shard\"$/table = \"$2\"/" \
    "$ROOT/plans/tenant-day-shard.toml" >"$out"
  echo "$out"
}

# json_field FILE EXPR: a field of rekey's --json report (EXPR in Python, `r` is the report).
json_field() {
  "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"
}

machine() {
  echo "rekey: $REKEY built $(date -u -r "$REKEY" '+%F %T UTC'); repo HEAD now $(git -C "$ROOT" describe --always --dirty --exclude '*' 2>/dev/null || echo unknown) (the binary may be older)"
  echo "backend: moto $("$PY" -c 'import importlib.metadata as m; print(m.version("moto"))') (src/local/serve.py), unless the script says otherwise"
  echo "machine: nproc=$(nproc), cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')\", memory=$(grep MemTotal /proc/meminfo | awk '{print $2, $3}') (shared 2-core machine: other builds/tests may run)"
}

# stop_ddb: stops the server start_ddb started (so the next starts empty).
stop_ddb() {
  if [[ -n "$DDB_PID" ]]; then
    kill "$DDB_PID" 2>/dev/null || true
    wait "$DDB_PID" 2>/dev/null || true
    DDB_PID=""
  fi
}
