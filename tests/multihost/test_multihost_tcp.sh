#!/usr/bin/env bash
# Multi-host integration test on one machine: four "hosts" are network namespaces on a private bridge (10.77.0.0/24,
# which exists only inside them), Open MPI runs over TCP between them (btl tcp,self; its rsh launcher reaches a
# "host" through `ip netns exec`), and host 3's link is limited with a tbf qdisc both ways. Checks that
#   1. the ranks really run one per namespace and the limited link is slow (probe.c),
#   2. `lbbsp train` over that network ends with the same parameters, train loss and test accuracy as the same run
#      on one host with 4 ranks and with 1 rank (relative 1e-5: float summation order is all that may differ),
#   3. the training traffic went through the limited link.
# Every namespace (and with them every veth, bridge and qdisc) is removed on exit. Needs root (ip netns), iproute2,
# Open MPI with mpicc, and python3 with numpy/h5py. Usage: $0 LBBSP SCRATCH
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cli/common.sh
source "$here/../cli/common.sh"
LBBSP=$(cd "$(dirname "$LBBSP")" && pwd)/$(basename "$LBBSP")
[[ -x $LBBSP ]] || fail "lbbsp binary '$LBBSP' missing: build it first (cmake --build build)"
# shellcheck source=tests/slurm/pick_python.sh
source "$here/../slurm/pick_python.sh"

HOSTS=4 SUBNET=10.77.0 RATE=${MULTIHOST_RATE:-10mbit} SLOW=3
[[ $(id -u) -eq 0 ]] || fail "needs root to create network namespaces (ip netns add): run as root"
for c in ip tc mpicc mpirun timeout; do
  command -v "$c" >/dev/null ||
    fail "'$c' not found: install the Debian packages iproute2 openmpi-bin libopenmpi-dev (scripts/setup.sh does)"
done
MPIRUN=$(command -v mpirun)

# Names carry this shell's pid, so parallel runs never collide and leftovers of a killed run can be told apart.
PFX=lbbsp-mh$$-
NS=()
for ((i = 0; i < HOSTS; ++i)); do NS+=("${PFX}h$i"); done
SW=${PFX}sw
netns_remove() { # kill whatever still runs inside, then delete (its veths, bridge and qdiscs go with it)
  local ns=$1 pids
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  # shellcheck disable=SC2086 # one pid per word
  [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}
HOSTTMP=$(mktemp -d /tmp/lbbsp-mh.XXXXXX) # short: Open MPI/PMIx put unix sockets in each host's TMPDIR
cleanup() {
  local rc=$? ns left
  for ns in "${NS[@]}" "$SW"; do netns_remove "$ns"; done
  rm -rf "$HOSTTMP"
  left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -F "$PFX" || true)
  [[ -z $left ]] || echo "WARNING: namespaces left behind: $left" >&2
  ((rc == 0)) && echo "PASS ($SECONDS s)" || echo "FAILED (exit $rc) after $SECONDS s; files in $SCRATCH" >&2
}
trap cleanup EXIT
trap 'exit 143' TERM HUP
trap 'exit 130' INT
# Leftovers of earlier runs that were killed before their trap ran (their shell is gone).
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^lbbsp-mh[0-9]+-' || true); do
  pid=${ns#lbbsp-mh}
  pid=${pid%%-*}
  kill -0 "$pid" 2>/dev/null || { echo "removing stale namespace $ns"; netns_remove "$ns"; }
done

# --- the network: SW holds the bridge; host i has eth0 = $SUBNET.(i+1), its peer is port p$i on the bridge.
ip netns add "$SW" 2>"$SCRATCH/netns.err" ||
  fail "cannot create network namespaces ('ip netns add' said: $(cat "$SCRATCH/netns.err")): this test needs" \
    "root with CAP_SYS_ADMIN and CAP_NET_ADMIN (a container may need --privileged)"
ip -n "$SW" link set lo up
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for ((i = 0; i < HOSTS; ++i)); do
  ip netns add "${NS[i]}"
  ip -n "${NS[i]}" link set lo up
  ip -n "${NS[i]}" link add eth0 type veth peer name "p$i" netns "$SW"
  ip -n "${NS[i]}" addr add "$SUBNET.$((i + 1))/24" dev eth0
  ip -n "${NS[i]}" link set eth0 up
  ip -n "$SW" link set "p$i" master br0
  ip -n "$SW" link set "p$i" up
done
# Host SLOW's link, both directions: its own egress and the bridge port's egress towards it.
ip netns exec "${NS[SLOW]}" tc qdisc add dev eth0 root tbf rate "$RATE" burst 32kb latency 400ms
ip netns exec "$SW" tc qdisc add dev "p$SLOW" root tbf rate "$RATE" burst 32kb latency 400ms
echo "network: ${HOSTS} namespaces ${PFX}h0..h$((HOSTS - 1)) on $SUBNET.0/24, host $SLOW limited to $RATE"

hostfile=$SCRATCH/hostfile hostexec=$SCRATCH/host-exec.sh agent=$SCRATCH/netns-agent.sh
: >"$hostfile"
for ((i = 0; i < HOSTS; ++i)); do echo "$SUBNET.$((i + 1)) slots=1" >>"$hostfile"; done
# host-exec.sh I CMD...: runs CMD as on host I: in its network namespace, with its own hostname (a UTS namespace)
# and its own TMPDIR, as separate machines have. One shared /tmp and hostname would make the Open MPI daemons of
# different "hosts" race for the same session folder.
{
  cat <<'EOF'
#!/usr/bin/env bash
i=${1:?usage: host-exec.sh HOST_INDEX COMMAND...}
shift
case $i in
EOF
  for ((i = 0; i < HOSTS; ++i)); do echo "  $i) ns=${NS[i]} ;;"; done
  cat <<'EOF'
  *) echo "host-exec: no test host $i" >&2; exit 255 ;;
esac
EOF
  echo "export TMPDIR=$HOSTTMP/host\$i"
  cat <<'EOF'
mkdir -p "$TMPDIR"
exec ip netns exec "$ns" unshare --uts -- /bin/sh -c 'echo "$0" >/proc/sys/kernel/hostname && exec "$@"' \
  "lbbsp-mh-h$i" "$@"
EOF
} >"$hostexec"
# Open MPI's rsh launcher runs `AGENT [options] HOST COMMAND...` as it would run ssh: this "ssh" runs COMMAND
# (one shell string) through host-exec.sh.
{
  cat <<'EOF'
#!/usr/bin/env bash
while [[ ${1:-} == -* ]]; do shift; done
host=${1:?usage: netns-agent.sh HOST COMMAND...}
shift
case $host in
EOF
  for ((i = 0; i < HOSTS; ++i)); do echo "  $SUBNET.$((i + 1))) i=$i ;;"; done
  cat <<'EOF'
  *) echo "netns-agent: unknown host $host" >&2; exit 255 ;;
esac
echo "$host -> host $i: $*" >>"$(dirname "$0")/agent.log"
exec "$(dirname "$0")/host-exec.sh" "$i" /bin/sh -c "$*"
EOF
} >"$agent"
chmod +x "$hostexec" "$agent"
# rtc_hwloc_vmhole=none: Debian's Open MPI 4.1 orted sometimes segfaults in hwloc_shmem_topology_write when
# started through the rsh launcher; the shared topology segment is an optimisation only.
mh_mpirun() { # mh_mpirun SECONDS ARGS...: mpirun from host 0 over the test network, one rank per host
  local limit=$1
  shift
  "$hostexec" 0 timeout -k 5 "$limit" "$MPIRUN" -n "$HOSTS" --hostfile "$hostfile" --map-by node \
    --bind-to none --mca plm rsh --mca ras ^slurm --mca plm_rsh_agent "$agent" --mca btl tcp,self \
    --mca btl_tcp_if_include "$SUBNET.0/24" --mca oob_tcp_if_include "$SUBNET.0/24" --mca rtc_hwloc_vmhole none \
    "$@"
}

# --- 1. the probe: where do the ranks run, and is host SLOW's link slow?
mpicc -O2 -o "$SCRATCH/probe" "$here/probe.c" || fail "mpicc could not build the probe (libopenmpi-dev installed?)"
mh_mpirun 60 "$SCRATCH/probe" >"$SCRATCH/probe.out" 2>&1 || { cat "$SCRATCH/probe.out"; fail "the probe failed over TCP between namespaces"; }
cat "$SCRATCH/probe.out"
for ((i = 0; i < HOSTS; ++i)); do
  want=$(stat -L -c %i "/run/netns/${NS[i]}")
  read -r got name < <(awk -v r="$i" '$1 == "ns" && $2 == r {print $3, $4}' "$SCRATCH/probe.out")
  [[ $got == "$want" ]] || fail "rank $i ran in network namespace '$got', expected ${NS[i]} ($want)"
  [[ $name == "lbbsp-mh-h$i" ]] || fail "rank $i ran on host '$name', expected lbbsp-mh-h$i"
done
# 2 MiB at RATE must take at least half its nominal time, and clearly longer than over the unlimited links.
rate_bits=$(awk -v r="$RATE" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u);
  m = (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : (u == "gbit") ? 1e9 : 1; print n * m }')
awk -v slow="$SLOW" -v bits="$rate_bits" '
  $1 == "send" { t[$2] = $3 }
  END {
    nominal = 2 * 1048576 * 8 / bits; fast = 0
    for (r in t) if (r != slow && t[r] > fast) fast = t[r]
    printf "probe: 2 MiB to host %d took %.3f s (nominal %.3f s at the limit), slowest other host %.3f s\n",
           slow, t[slow], nominal, fast
    exit !(t[slow] >= 0.5 * nominal && t[slow] > 2 * fast)
  }' "$SCRATCH/probe.out" || fail "the tbf limit on host $SLOW's link is not in effect (times above)"

# --- 2. the same training run on one host (1 and 4 ranks) and on the four namespace hosts.
timeout 60 "$LBBSP" data synth --samples 4096 --features 32 --classes 4 --seed 9 --out "$SCRATCH/data.h5" >/dev/null ||
  fail "lbbsp data synth failed"
train=(train --data "$SCRATCH/data.h5" --model logreg --epochs 1 --global-batch 128 --lr 0.2 --seed 9
  --max-iterations 25 --threads 1 --bind none)
run_ref() { # run_ref RANKS NAME
  mpirun_n "$1" "$LBBSP" "${train[@]}" --summary-json "$SCRATCH/$2.json" --save-params "$SCRATCH/$2.h5" \
    >"$SCRATCH/$2.log" 2>&1 || { cat "$SCRATCH/$2.log"; fail "single-host run with $1 rank(s) failed"; }
}
run_ref 1 single1
run_ref 4 single4
sent_bytes() { ip netns exec "${NS[SLOW]}" tc -s qdisc show dev eth0 | awk '/Sent/ {print $2; exit}'; }
before=$(sent_bytes)
t0=$SECONDS
mh_mpirun 240 "$LBBSP" "${train[@]}" --summary-json "$SCRATCH/multi4.json" --save-params "$SCRATCH/multi4.h5" \
  >"$SCRATCH/multi4.log" 2>&1 || { cat "$SCRATCH/multi4.log"; fail "the 4-host run over TCP failed"; }
after=$(sent_bytes)
echo "multi-host training: $((SECONDS - t0)) s; host $SLOW sent $((after - before)) bytes through its limited link"
((after - before > 10000)) || fail "host $SLOW sent only $((after - before)) bytes during training: traffic bypassed the test network"
grep -q ' -> ' "$SCRATCH/agent.log" || fail "the rsh agent was never used: ranks did not start on the namespace hosts"

for f in single1 single4 multi4; do
  ranks=$([[ $f == single1 ]] && echo 1 || echo 4)
  "$PYTHON" "$here/../slurm/check_results.py" summary "$SCRATCH/$f.json" --ranks "$ranks" --iterations 25 \
    --model logreg --global-batch 128 || fail "$f: summary JSON is not sane"
done
"$PYTHON" "$here/../slurm/check_results.py" compare "$SCRATCH/single4.json" "$SCRATCH/multi4.json" --rtol 1e-5 \
  --params "$SCRATCH/single4.h5" "$SCRATCH/multi4.h5" || fail "4 ranks on one host and on four hosts disagree"
"$PYTHON" "$here/../slurm/check_results.py" compare "$SCRATCH/single1.json" "$SCRATCH/multi4.json" --rtol 1e-5 \
  --params "$SCRATCH/single1.h5" "$SCRATCH/multi4.h5" || fail "1 rank on one host and 4 ranks on four hosts disagree"
