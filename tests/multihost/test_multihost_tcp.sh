#!/usr/bin/env bash
# Multi-host integration test on one machine: four "hosts" are network namespaces on a private bridge (10.77.0.0/24,
# which exists only inside them), Open MPI runs over TCP between them (btl tcp,self; its rsh launcher reaches a
# "host" through `ip netns exec`), and host 3's link is limited with a tbf qdisc both ways. Checks that
#   1. the ranks really run one per namespace and the limited link is slow (probe.c),
#   2. `lbbsp train` over that network ends with the same parameters, train loss and test accuracy as the same run
#      on one host with 4 ranks and with 1 rank (relative 1e-5: float summation order is all that may differ),
#      also with the lbbsp-cpu balancer splitting the global batch unevenly (host 3 emulated at half speed),
#   3. the training traffic went through the limited link.
# The hosts are tests/multihost/netns_hosts.sh's; every namespace (and with them every veth, bridge and qdisc) is
# removed on exit. Needs root (ip netns), iproute2, Open MPI with mpicc, and python3 with numpy/h5py.
# Usage: $0 LBBSP SCRATCH
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cli/common.sh
source "$here/../cli/common.sh"
LBBSP=$(cd "$(dirname "$LBBSP")" && pwd)/$(basename "$LBBSP")
[[ -x $LBBSP ]] || fail "lbbsp binary '$LBBSP' missing: build it first (cmake --build build)"
# shellcheck source=tests/slurm/pick_python.sh
source "$here/../slurm/pick_python.sh"

# shellcheck source=tests/multihost/netns_hosts.sh
source "$here/netns_hosts.sh"

# Each emulated host has its own /tmp: a binary or scratch folder under /tmp (CI may clone there) is staged into
# /var/tmp, and the files copied back at the end.
netns_stage_out_of_tmp

HOSTS=4 SUBNET=10.77.0 RATE=${MULTIHOST_RATE:-10mbit} SLOW=3
netns_hosts_check
for c in mpicc mpirun; do
  command -v "$c" >/dev/null || fail "'$c' not found: install the Debian packages openmpi-bin libopenmpi-dev (scripts/setup.sh)"
done
MPIRUN=$(command -v mpirun)
cleanup() {
  local rc=$?
  netns_hosts_down
  netns_unstage
  ((rc == 0)) && echo "PASS ($SECONDS s)" || echo "FAILED (exit $rc) after $SECONDS s; files in $OUT_SCRATCH" >&2
}
trap cleanup EXIT
trap 'exit 143' TERM HUP
trap 'exit 130' INT
netns_hosts_up "$HOSTS" "$SUBNET" "$SCRATCH"
netns_hosts_limit "$SLOW" "$RATE"

hostfile=$SCRATCH/hostfile agent=$SCRATCH/netns-agent.sh
: >"$hostfile"
for ((i = 0; i < HOSTS; ++i)); do echo "$SUBNET.$((i + 1)) slots=1" >>"$hostfile"; done
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
chmod +x "$agent"
# rtc_hwloc_vmhole=none: Debian's Open MPI 4.1 orted sometimes segfaults in hwloc_shmem_topology_write when
# started through the rsh launcher; the shared topology segment is an optimisation only.
mh_mpirun() { # [MH_NP=N] mh_mpirun SECONDS ARGS...: mpirun from host 0 over the test network, one rank per host
  local limit=$1 np=${MH_NP:-$HOSTS}  # more ranks than hosts: dealt round-robin (--map-by node)
  shift
  "$HOSTEXEC" 0 timeout -k 5 "$limit" "$MPIRUN" -n "$np" --oversubscribe --hostfile "$hostfile" --map-by node \
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
# Uneven batch splits (LB-BSP balancer, host 3 emulated at half speed) change timing over the network, never the math.
mh_mpirun 240 "$LBBSP" "${train[@]}" --balancer lbbsp-cpu --straggle static:1,1,1,0.5 \
  --summary-json "$SCRATCH/multi4lb.json" --save-params "$SCRATCH/multi4lb.h5" >"$SCRATCH/multi4lb.log" 2>&1 ||
  { cat "$SCRATCH/multi4lb.log"; fail "the 4-host run with --balancer lbbsp-cpu failed"; }

# How the job sees its hosts: MPI's shared-memory groups are the network namespaces.
for layout in "4 1-1" "8 2-2" "6 1-2"; do
  read -r np per <<<"$layout"
  MH_NP=$np mh_mpirun 60 "$LBBSP" info >"$SCRATCH/info$np.log" 2>&1 ||
    { cat "$SCRATCH/info$np.log"; fail "lbbsp info on $np ranks failed"; }
  got=$(grep '^nodes' "$SCRATCH/info$np.log")
  [[ $got == "nodes: 4, ranks per node $per" ]] ||
    fail "lbbsp info on $np ranks over four hosts: expected 'nodes: 4, ranks per node $per', got '$got'"
done

# Several ranks per host with --allreduce node: each host sums in shared memory and one sum per host crosses TCP;
# 8 ranks = 2 on every host (shares reduced in parallel), 6 ranks = 2,2,1,1 (uneven: the first rank of each host
# reduces all of it).
for np in 8 6; do
  MH_NP=$np mh_mpirun 240 "$LBBSP" "${train[@]}" --allreduce node --summary-json "$SCRATCH/multi$np.json" \
    --save-params "$SCRATCH/multi$np.h5" >"$SCRATCH/multi$np.log" 2>&1 ||
    { cat "$SCRATCH/multi$np.log"; fail "the $np-rank run on four hosts with --allreduce node failed"; }
  grep -q '"step_mode": *"host/node-shared"' "$SCRATCH/multi$np.json" ||
    fail "the $np-rank run did not use host/node-shared: $(grep -o '"step_mode": *"[^"]*"' "$SCRATCH/multi$np.json")"
done

for f in single1 single4 multi4 multi4lb multi8 multi6; do
  ranks=$([[ $f == single1 ]] && echo 1 || echo "${f//[!0-9]/}")
  "$PYTHON" "$here/../slurm/check_results.py" summary "$SCRATCH/$f.json" --ranks "$ranks" --iterations 25 \
    --model logreg --global-batch 128 || fail "$f: summary JSON is not sane"
done
"$PYTHON" "$here/../slurm/check_results.py" compare "$SCRATCH/single4.json" "$SCRATCH/multi4.json" --rtol 1e-5 \
  --params "$SCRATCH/single4.h5" "$SCRATCH/multi4.h5" || fail "4 ranks on one host and on four hosts disagree"
"$PYTHON" "$here/../slurm/check_results.py" compare "$SCRATCH/single1.json" "$SCRATCH/multi4.json" --rtol 1e-5 \
  --params "$SCRATCH/single1.h5" "$SCRATCH/multi4.h5" || fail "1 rank on one host and 4 ranks on four hosts disagree"
"$PYTHON" "$here/../slurm/check_results.py" compare "$SCRATCH/single1.json" "$SCRATCH/multi4lb.json" --rtol 1e-5 \
  --params "$SCRATCH/single1.h5" "$SCRATCH/multi4lb.h5" ||
  fail "1 rank on one host and 4 ranks on four hosts with the lbbsp-cpu balancer disagree"
for np in 8 6; do
  "$PYTHON" "$here/../slurm/check_results.py" compare "$SCRATCH/single1.json" "$SCRATCH/multi$np.json" --rtol 1e-5 \
    --params "$SCRATCH/single1.h5" "$SCRATCH/multi$np.h5" ||
    fail "1 rank on one host and $np ranks on four hosts with --allreduce node disagree"
done
