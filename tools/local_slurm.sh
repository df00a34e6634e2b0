#!/usr/bin/env bash
# A real two-node Slurm cluster on this one host, for scaleguard's cluster tests and for trying
# `pytest perf/ --perf-slurm` without a cluster: munge, slurmctld and two slurmd (-N n1, -N n2,
# each with its own port, both at 127.0.0.1) from Debian's slurm-wlm 22.05. Run as root.
#
#   tools/local_slurm.sh start   # idempotent; waits (60 s at most) until both nodes are idle
#   tools/local_slurm.sh stop    # cancels every job, stops the daemons
#   tools/local_slurm.sh status
#
# Partitions: "debug" (both nodes, default) and "closed" (both nodes, State=DOWN: a job there
# pends forever, for the pending-deadline test). The state lives in $SCALEGUARD_SLURM_DIR
# (default /tmp/scaleguard-slurm); SLURM_CONF must point at its slurm.conf for the client
# commands, which `start` prints and `env` prints as an export line.
set -euo pipefail
DIR=${SCALEGUARD_SLURM_DIR:-/tmp/scaleguard-slurm}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF
CPUS=${SCALEGUARD_SLURM_CPUS:-$(nproc)}
MEM_MB=${SCALEGUARD_SLURM_MEM_MB:-4000}

write_conf() {
    mkdir -p "$DIR/state" "$DIR/spool/n1" "$DIR/spool/n2"
    local host
    host=$(hostname -s)
    cat >"$CONF" <<CONF
ClusterName=scaleguard
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=600
KillWait=5
InactiveLimit=0
MessageTimeout=10
SlurmdTimeout=30
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=16818 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=16819 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
PartitionName=closed Nodes=n1,n2 MaxTime=INFINITE State=DOWN
CONF
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

port_busy() {  # a TCP listener on 127.0.0.1/0.0.0.0:$1 (ss from iproute2, else /proc/net/tcp)
    if command -v ss >/dev/null; then
        ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
    else
        grep -qi ":$(printf '%04X' "$1") 00000000:0000 0A" /proc/net/tcp 2>/dev/null
    fi
}

start() {
    command -v slurmctld >/dev/null || { echo "slurm-wlm is not installed: apt-get install -y slurm-wlm munge" >&2; exit 2; }
    write_conf
    if ! pgrep -x munged >/dev/null; then
        mkdir -p /run/munge /var/log/munge /var/lib/munge
        chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge/munge.key 2>/dev/null || true
        [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
        runuser -u munge -- /usr/sbin/munged --force
    fi
    if ! running "$DIR/slurmctld.pid"; then
        # another cluster (another state dir) on these ports would answer our commands with its
        # own nodes and jobs: refuse instead of using it
        for port in 16817 16818 16819; do
            if port_busy "$port"; then
                echo "local slurm: port $port is taken (another local cluster? stop it with its own" \
                     "SCALEGUARD_SLURM_DIR: tools/local_slurm.sh stop)" >&2
                exit 1
            fi
        done
        slurmctld -f "$CONF"
    fi
    for n in n1 n2; do
        running "$DIR/slurmd-$n.pid" || slurmd -f "$CONF" -N "$n"
    done
    local deadline=$((SECONDS + 60))
    until [ "$(sinfo -h -p debug -o '%t' 2>/dev/null | sort -u | tr -d '\n')" = "idle" ]; do
        if [ $SECONDS -ge $deadline ]; then
            echo "local slurm: nodes not idle after 60 s:" >&2
            sinfo -N -l >&2 || true
            tail -5 "$DIR/slurmctld.log" >&2 || true
            exit 1
        fi
        # a node left DOWN by an earlier stop comes back
        scontrol update nodename=n1,n2 state=resume >/dev/null 2>&1 || true
        sleep 1
    done
    echo "local slurm: up (export SLURM_CONF=$CONF)"
}

stop() {
    if [ -f "$CONF" ]; then
        scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        for f in "$DIR"/slurmd-n1.pid "$DIR"/slurmd-n2.pid "$DIR"/slurmctld.pid; do
            running "$f" && kill "$(cat "$f")" 2>/dev/null || true
        done
        for f in "$DIR"/slurmd-n1.pid "$DIR"/slurmd-n2.pid "$DIR"/slurmctld.pid; do
            for _ in $(seq 50); do running "$f" || break; sleep 0.1; done
        done
    fi
    echo "local slurm: stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) export SLURM_CONF=$CONF; sinfo -N -l; squeue ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
