#!/usr/bin/env bash
# A single-node Slurm on this machine, from Debian's packages, to test the Slurm profile.
#
#   apt-get install slurm-wlm munge        # once; needs root
#   tests/local_slurm.sh up DIR            # munged, slurmctld and slurmd on this host
#   tests/local_slurm.sh down DIR          # stop the daemons, cancel jobs, remove DIR
#
# `up` writes /etc/slurm/slurm.conf (one node: this host, all its CPUs, no GPUs, one
# partition `debug`; no accounting database, so job states come from squeue, which keeps
# finished jobs for MinJobAge) with state and logs in DIR, starts the daemons and waits until
# sinfo shows the node idle; it exits non-zero, with the daemons' log tails, when that does
# not happen within 60 s. The configuration must be at the default path: Snakemake's job
# step drops SLURM_* variables (SLURM_CONF too) before its nested srun. A slurm.conf that
# `up` did not write is never touched; `down` removes only its own.
set -euo pipefail

usage() { echo "usage: $0 up|down DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$(realpath -m "$2")
conf=/etc/slurm/slurm.conf
marker="# written by rlcore tests/local_slurm.sh for $dir"

pids_of() { pgrep -f "$1 .*-f $conf" || true; }
ours() { [ -f "$conf" ] && [ "$(head -n 1 "$conf")" = "$marker" ]; }

down() {
    ours || { echo "$conf is not this local Slurm's; nothing to stop" >&2; rm -rf "$dir"; return 0; }
    scancel --quiet --user root 2>/dev/null || true
    for daemon in slurmd slurmctld; do
        for pid in $(pids_of "$daemon"); do kill "$pid" 2>/dev/null || true; done
    done
    for _ in $(seq 50); do
        [ -z "$(pids_of slurmd)$(pids_of slurmctld)" ] && break
        sleep 0.1
    done
    for daemon in slurmd slurmctld; do
        for pid in $(pids_of "$daemon"); do kill -9 "$pid" 2>/dev/null || true; done
    done
    rm -f "$conf"
    rm -rf "$dir"
}

up() {
    command -v slurmctld > /dev/null && command -v munged > /dev/null || {
        echo "slurm-wlm and munge are not installed: apt-get install slurm-wlm munge" >&2
        exit 3
    }
    [ "$(id -u)" = 0 ] || { echo "a local Slurm needs root" >&2; exit 3; }
    if [ -f "$conf" ] && ! ours; then
        echo "$conf exists and was not written by this script: not touching it" >&2
        exit 3
    fi
    mkdir -p "$dir"/{state,spool,log} /etc/slurm
    local host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))

    # munge: the authentication Slurm's daemons and clients share.
    if ! pgrep -x munged > /dev/null; then
        [ -f /etc/munge/munge.key ] || mungekey --create --keyfile /etc/munge/munge.key
        install -d -o munge -g munge -m 0755 /run/munge
        install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
        runuser -u munge -- /usr/sbin/munged
    fi

    cat > "$conf" <<EOF
$marker
ClusterName=rlcore-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
MinJobAge=3600
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    slurmctld -f "$conf"
    slurmd -f "$conf"
    for _ in $(seq 120); do
        if [ "$(sinfo -h -o %T 2>/dev/null)" = "idle" ]; then
            echo "local Slurm up: $(sinfo -h -o '%P %D %T %N')"
            return 0
        fi
        sleep 0.5
    done
    echo "the local Slurm did not become idle within 60 s:" >&2
    sinfo >&2 || true
    tail -n 20 "$dir"/log/*.log >&2 || true
    exit 1
}

case $action in
    up) up ;;
    down) down ;;
    *) usage ;;
esac
