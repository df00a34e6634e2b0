#!/usr/bin/env bash
# Issue 39, "done means", as a user would do it on this machine: two sessions writing one local
# PostgreSQL at once; the server stopped and started around a session, with the exact row counts
# before and after; an existing SQLite history moved in (twice: the second adds nothing).
#
#     bash benchmarks/history_fleet_demo.sh            # from the repository root; about 5 minutes
#
# A throwaway server (tools/local_postgres.py) under a temporary directory, removed at the end.
# The sessions are small (transformer_tiny single and ddp, world sizes 1 and 2, CPU gloo) and run
# against an empty baseline directory: every case NEW; what is shown is where their runs land.
set -euo pipefail
W=$(mktemp -d /tmp/sg-fleet-XXXXXX)
chmod 755 "$W"
trap 'python tools/local_postgres.py stop "$W/pg" >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
python tools/local_postgres.py start "$W/pg" > "$W/dsns"
DSN=$(sed -n 1p "$W/dsns")
READER=$(sed -n 2p "$W/dsns")
mkdir -p "$W/baselines"
SESSION=(-p no:cacheprovider --perf-models transformer_tiny --perf-modes single,ddp --perf-world-sizes 1,2
         --perf-baselines "$W/baselines" --perf-history "$DSN" --benchmark-storage "$W/benchmarks" -q)
count() {  # the server's rows, by the server's own count
  python - "$DSN" <<'PY'
import sys, psycopg
with psycopg.connect(sys.argv[1]) as c:
    runs, sessions = c.execute("SELECT count(*), count(DISTINCT session) FROM runs").fetchone()
print(f"server: {runs} runs, {sessions} sessions")
PY
}
said() { grep -E "history|spool" "$1" | grep -v "^perf/" | sed "s/^/    /" || true; }

echo "== two sessions at once, one server"
pytest perf/ "${SESSION[@]}" --benchmark-save=a > "$W/a.log" 2>&1 & A=$!
pytest perf/ "${SESSION[@]}" --benchmark-save=b > "$W/b.log" 2>&1 & B=$!
wait $A; echo "  session a exit $?"; said "$W/a.log"
wait $B; echo "  session b exit $?"; said "$W/b.log"
count

echo "== the server stopped: a session measures, judges and keeps its runs in the spool"
python tools/local_postgres.py stop "$W/pg"
pytest perf/ "${SESSION[@]}" --benchmark-save=c > "$W/c.log" 2>&1; echo "  session c exit $?"; said "$W/c.log"
echo "== the server started: nothing of session c there yet"
python tools/local_postgres.py start "$W/pg" > /dev/null
count
pytest perf/ "${SESSION[@]}" --benchmark-save=d > "$W/d.log" 2>&1; echo "  session d exit $?"; said "$W/d.log"
count

echo "== an existing SQLite history moved in, twice"
pytest perf/ "${SESSION[@]}" --perf-history "$W/runner.sqlite" --benchmark-save=e > "$W/e.log" 2>&1
echo "  session e (its own SQLite history) exit $?"; said "$W/e.log"
scaleguard history import "$W/runner.sqlite" --history "$DSN" | sed "s/^/    /"
scaleguard history import "$W/runner.sqlite" --history "$DSN" | sed "s/^/    /"
count

echo "== a reader's view (a read-only role), and the password nowhere"
scaleguard history --history "$READER" --last 2 > "$W/view.log" 2>&1; sed "s/^/    /" "$W/view.log" | head -12
PASSWORD=$(python -c "import sys; sys.path.insert(0, '.'); from tools import local_postgres as p; print(p.PASSWORD, p.READER_PASSWORD)")
for secret in $PASSWORD; do
  if grep -rl -- "$secret" "$W"/*.log "$W/benchmarks" 2>/dev/null; then echo "  PASSWORD FOUND"; exit 1; fi
done
echo "  neither password in any log or saved run"
