# Emulated hosts for the multi-host tests: network namespaces on a private bridge. Source it, then:
#   netns_hosts_check                      # root, iproute2; fails with what is missing
#   netns_hosts_up N SUBNET WORKDIR        # hosts 0..N-1 at SUBNET.1 .. SUBNET.N (SUBNET like 10.77.0)
#   netns_hosts_limit I RATE               # tbf limit on host I's link, both directions (e.g. 10mbit)
#   "$HOSTEXEC" I CMD...                   # run CMD on host I
#   netns_hosts_down                       # idempotent; call it from an EXIT trap
# Host I is network namespace ${NS[I]} with eth0 = SUBNET.(I+1)/24 on a bridge that lives in a namespace of its own
# (${SW}): the subnet exists only inside those namespaces, nothing is added to the machine's own network. HOSTEXEC
# also gives each host its own hostname (UTS namespace, lbbsp-mh-hI) and its own /tmp (a bind mount in a private
# mount namespace), as separate machines have: with one shared /tmp and hostname, Open MPI daemons and Slurm's PMIx
# plugin on different "hosts" race for the same folders. Everything else (the repository, scratch) is shared, as
# on a cluster's shared filesystem; keep files all hosts need out of /tmp.
# Names carry the test shell's pid, so parallel runs never collide and a killed run's leftovers are recognised and
# removed by the next run.
# shellcheck shell=bash

NS=()
SW=''
HOSTTMP=''
HOSTEXEC=''

netns_hosts_check() {
  [[ $(id -u) -eq 0 ]] || fail "needs root to create network namespaces (ip netns add): run as root"
  local c
  for c in ip tc nsenter unshare mount timeout; do
    command -v "$c" >/dev/null || fail "'$c' not found: install the Debian packages iproute2 util-linux (scripts/setup.sh)"
  done
}

netns_remove() { # kill whatever still runs inside, then delete (its veths, bridge and qdiscs go with it)
  local ns=$1 pids
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  # shellcheck disable=SC2086 # one pid per word
  [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}

netns_hosts_down() {
  local ns left
  for ns in "${NS[@]}" "$SW"; do [[ -n $ns ]] && netns_remove "$ns"; done
  [[ -n $HOSTTMP ]] && rm -rf "$HOSTTMP"
  if [[ -n $SW ]]; then
    left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -F "${SW%sw}" || true)
    [[ -z $left ]] || echo "WARNING: namespaces left behind: $left" >&2
  fi
  NS=() SW='' HOSTTMP=''
}

netns_hosts_up() {
  local n=$1 subnet=$2 work=$3 pfx=lbbsp-mh$$- i ns pid
  # Leftovers of earlier runs that were killed before their trap ran (their shell is gone).
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^lbbsp-mh[0-9]+-' || true); do
    pid=${ns#lbbsp-mh}
    pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null || { echo "removing stale namespace $ns"; netns_remove "$ns"; }
  done
  SW=${pfx}sw
  ip netns add "$SW" 2>"$work/netns.err" ||
    fail "cannot create network namespaces ('ip netns add' said: $(cat "$work/netns.err")): this test needs" \
      "root with CAP_SYS_ADMIN and CAP_NET_ADMIN (a container may need --privileged)"
  ip -n "$SW" link set lo up
  ip -n "$SW" link add br0 type bridge
  ip -n "$SW" link set br0 up
  for ((i = 0; i < n; ++i)); do
    NS+=("${pfx}h$i")
    ip netns add "${NS[i]}"
    ip -n "${NS[i]}" link set lo up
    ip -n "${NS[i]}" link add eth0 type veth peer name "p$i" netns "$SW"
    ip -n "${NS[i]}" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "${NS[i]}" link set eth0 up
    ip -n "$SW" link set "p$i" master br0
    ip -n "$SW" link set "p$i" up
  done
  HOSTTMP=$(mktemp -d /tmp/lbbsp-mh.XXXXXX) # short: Open MPI, PMIx and Slurm put unix sockets there
  HOSTEXEC=$work/host-exec.sh
  {
    cat <<'EOF'
#!/usr/bin/env bash
# host-exec.sh I CMD...: runs CMD on test host I (its network namespace, hostname and TMPDIR).
i=${1:?usage: host-exec.sh HOST_INDEX COMMAND...}
shift
case $i in
EOF
    for ((i = 0; i < n; ++i)); do echo "  $i) ns=${NS[i]} ;;"; done
    cat <<'EOF'
  *) echo "host-exec: no test host $i" >&2; exit 255 ;;
esac
EOF
    echo "tmp=$HOSTTMP/host\$i"
    cat <<'EOF'
mkdir -p "$tmp"
chmod 1777 "$tmp"
# nsenter, not `ip netns exec`: the latter remounts /sys, which hides /sys/fs/cgroup (slurmd needs it).
# A private mount namespace gives the host its own /tmp (Open MPI session folders, Slurm's PMIx folders).
exec nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private -- /bin/sh -c \
  'echo "$0" >/proc/sys/kernel/hostname && mount --bind "$1" /tmp && shift && exec "$@"' "lbbsp-mh-h$i" "$tmp" "$@"
EOF
  } >"$HOSTEXEC"
  chmod +x "$HOSTEXEC"
  echo "network: $n hosts ${pfx}h0..h$((n - 1)) on $subnet.0/24 (bridge in $SW)"
}

netns_hosts_limit() { # netns_hosts_limit I RATE: host I's egress and the bridge port's egress towards it
  ip netns exec "${NS[$1]}" tc qdisc add dev eth0 root tbf rate "$2" burst 32kb latency 400ms
  ip netns exec "$SW" tc qdisc add dev "p$1" root tbf rate "$2" burst 32kb latency 400ms
  echo "network: host $1 limited to $2 both ways (tbf)"
}

# netns_stage_out_of_tmp: each emulated host has its own /tmp, so a binary, checkout or scratch folder under /tmp
# (CI may clone there) is staged into /var/tmp. Uses and updates LBBSP, SCRATCH and (when set) SRC; sets STAGE
# (empty when nothing was staged) and OUT_SCRATCH (the caller's scratch). netns_unstage copies results back.
netns_stage_out_of_tmp() {
  _under_tmp() { case $(realpath -m "$1")/ in /tmp/*) return 0 ;; esac; return 1; }
  STAGE="" OUT_SCRATCH=$SCRATCH
  if _under_tmp "$SCRATCH" || _under_tmp "$LBBSP" || { [[ -n ${SRC:-} ]] && _under_tmp "$SRC"; }; then
    STAGE=$(mktemp -d /var/tmp/lbbsp-stage.XXXXXX)
    mkdir -p "$STAGE/bin" "$STAGE/scratch"
    cp "$LBBSP" "$STAGE/bin/lbbsp"
    LBBSP=$STAGE/bin/lbbsp SCRATCH=$STAGE/scratch
    if [[ -n ${SRC:-} ]]; then
      mkdir -p "$STAGE/src"
      cp -r "$SRC/scripts" "$STAGE/src/"
      SRC=$STAGE/src
    fi
    echo "note: /tmp is private to each emulated host: staged what the hosts need in $STAGE"
  fi
}
netns_unstage() {
  [[ -n ${STAGE:-} ]] || return 0
  cp -r "$SCRATCH/." "$OUT_SCRATCH/" 2>/dev/null || true
  rm -rf "$STAGE"
}
