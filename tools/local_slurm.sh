#!/usr/bin/env bash
# A real Slurm cluster on this one host, for scaleguard's cluster tests and for trying
# `pytest perf/ --perf-slurm` without a cluster: munge, slurmctld and four slurmd (-N n1 .. -N n4,
# each with its own port and its own address, 127.0.0.2 .. 127.0.0.5) from Debian's slurm-wlm
# 22.05. Run as root.
#
#   tools/local_slurm.sh start   # idempotent; waits (60 s at most) until every node is idle
#   tools/local_slurm.sh stop    # cancels every job, stops the daemons
#   tools/local_slurm.sh status
#
# What a real GPU cluster has and this one fakes: each node has a GPU GRES (gpu:fake:2, from
# gres.conf with /dev/null-like character devices as the device files and AutoDetect=off), so a job's GPU request,
# Slurm's CUDA_VISIBLE_DEVICES per node or per task and the GRES type are Slurm's own; and
# task/affinity binds each task to the CPUs it was given (-c). No node has a real GPU.
#
# Partitions: "debug" (n1..n4, default); "urgent" (the same nodes, a higher priority tier: a job
# there preempts a "debug" job, as a site's preemption does); "mixed" (n4 and n5, whose GPUs are
# of another type: a mixed allocation); "closed" (State=DOWN: a job there pends forever, for the
# pending-deadline test). The state lives in $SCALEGUARD_SLURM_DIR
# (default /tmp/scaleguard-slurm); SLURM_CONF must point at its slurm.conf for the client
# commands, which `start` prints and `env` prints as an export line.
# SCALEGUARD_SLURM_NODES (default 4, at most 8) and SCALEGUARD_SLURM_GPUS (per node, default 2).
set -euo pipefail
DIR=${SCALEGUARD_SLURM_DIR:-/tmp/scaleguard-slurm}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF
CPUS=${SCALEGUARD_SLURM_CPUS:-$(nproc)}
MEM_MB=${SCALEGUARD_SLURM_MEM_MB:-4000}
NODES=${SCALEGUARD_SLURM_NODES:-4}
GPUS=${SCALEGUARD_SLURM_GPUS:-2}
[ "$NODES" -ge 1 ] && [ "$NODES" -le 8 ] || { echo "SCALEGUARD_SLURM_NODES is 1..8" >&2; exit 2; }
ODD=n$((NODES + 1))  # one more node, of another GPU type, only in the partition "mixed"
NAMES="$(seq -f 'n%g' 1 "$NODES" | tr '\n' ' ')$ODD"
PORTS="16817 $(seq -s ' ' 16818 $((16818 + NODES)))"

write_conf() {
    mkdir -p "$DIR/state" "$DIR/dev"
    local host i
    host=$(hostname -s)
    # the fake GPUs' device files: character devices (slurmd refuses plain files), each a
    # /dev/null (major 1, minor 3): nothing can be done with them but be handed out
    for i in $(seq 0 $((GPUS - 1))); do
        [ -c "$DIR/dev/nvidia$i" ] || { rm -f "$DIR/dev/nvidia$i"; mknod -m 666 "$DIR/dev/nvidia$i" c 1 3; }
    done
    echo "AutoDetect=off" >"$DIR/gres.conf"
    for i in $(seq 1 "$NODES"); do
        mkdir -p "$DIR/spool/n$i"
        echo "NodeName=n$i Name=gpu Type=fake File=$DIR/dev/nvidia[0-$((GPUS - 1))]" >>"$DIR/gres.conf"
    done
    mkdir -p "$DIR/spool/$ODD"
    echo "NodeName=$ODD Name=gpu Type=fake2 File=$DIR/dev/nvidia[0-$((GPUS - 1))]" >>"$DIR/gres.conf"
    cat >"$CONF" <<CONF
ClusterName=scaleguard
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
GresTypes=gpu
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# a job in the partition "urgent" preempts (cancels) jobs of "debug" on the nodes it needs
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
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
CONF
    # every node on its own loopback address: a rendezvous or a gloo socket that assumed one
    # address for every node would be found here
    for i in $(seq 1 $((NODES + 1))); do
        local type=fake
        [ "n$i" = "$ODD" ] && type=fake2
        echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.$((i + 1)) Port=$((16817 + i)) CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$type:$GPUS State=UNKNOWN" >>"$CONF"
    done
    cat >>"$CONF" <<CONF
PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4 PriorityTier=1
PartitionName=urgent Nodes=n[1-$NODES] MaxTime=INFINITE State=UP PriorityTier=10
PartitionName=mixed Nodes=n$NODES,$ODD MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=closed Nodes=n[1-$NODES] MaxTime=INFINITE State=DOWN
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
        for port in $PORTS; do
            if port_busy "$port"; then
                echo "local slurm: port $port is taken (another local cluster? stop it with its own" \
                     "SCALEGUARD_SLURM_DIR: tools/local_slurm.sh stop)" >&2
                exit 1
            fi
        done
        slurmctld -f "$CONF"
    fi
    for n in $NAMES; do
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
        scontrol update nodename="n[1-$((NODES + 1))]" state=resume >/dev/null 2>&1 || true
        sleep 1
    done
    echo "local slurm: up (export SLURM_CONF=$CONF)"
}

stop() {
    if [ -f "$CONF" ]; then
        scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        for f in "$DIR"/slurmd-n*.pid "$DIR"/slurmctld.pid; do
            running "$f" && kill "$(cat "$f")" 2>/dev/null || true
        done
        for f in "$DIR"/slurmd-n*.pid "$DIR"/slurmctld.pid; do
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
