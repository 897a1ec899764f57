#!/bin/sh
# The "ssh" that mpiexec uses to start its per-node daemon on an emulated node of
# benchmarks/netcluster.py (MPICH: -launcher-exec, Open MPI: plm_ssh_agent):
#     netcluster_agent.sh [-OPTION ...] nodeK COMMAND...
# runs COMMAND with sh inside node K -- network namespace $NETCLUSTER_PREFIX-nK, hostname nodeK,
# bound to its CPUs if NETCLUSTER_CPUS says so --
# as sshd would on a real node (ssh joins the words of COMMAND and hands them to a shell).
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
case "$host" in node[0-9]*) ;; *) echo "netcluster_agent.sh: not a node name: $host" >&2; exit 255 ;; esac
[ -n "$NETCLUSTER_PREFIX" ] || { echo "netcluster_agent.sh: NETCLUSTER_PREFIX is not set" >&2; exit 255; }
k=${host#node}
# node k's CPUs: field k+1 of NETCLUSTER_CPUS ("0;1;0"), empty = all
cpus=$(printf '%s' "${NETCLUSTER_CPUS:-}" | cut -d';' -f$((k + 1)))
exec ip netns exec "$NETCLUSTER_PREFIX-n$k" ${cpus:+taskset -c "$cpus"} unshare --uts sh -c "hostname $host && $*"
