# A throw-away Slurm (munged + slurmctld + slurmd) for tests. Source it, then either
#   minicluster_start DIR                      # one node: this machine, on free non-default ports
# or, with emulated hosts from tests/multihost/netns_hosts.sh,
#   minicluster_start_hosts DIR HOSTEXEC SUBNET N   # slurmctld on host 0 (SUBNET.1), slurmd on hosts 1..N-1
# and then
#   mc sbatch ... / mc squeue / mc scontrol ...  # client commands (on host 0 when the cluster is on emulated hosts)
#   minicluster_wait JOBID SECONDS             # prints the job's final state
#   minicluster_stop                           # idempotent; call it from an EXIT trap
#   minicluster_teardown DIR                   # stop, keep the logs in $SCRATCH/daemon-logs, remove DIR
# DIR: a fresh, short path (munge's socket lives there; ~100-byte limit), seen by every host (so not /tmp when the
# hosts have their own /tmp). Root only (slurmd starts job steps as the submitting user). Nothing system-wide is
# touched: own munge key and socket, state, spool and logs under DIR, config in DIR/slurm.conf (exported as
# SLURM_CONF), job ids starting at a random number (Slurm's PMIx plugin names folders after them). proctrack/linuxproc + task/none need no cgroups. Every daemon runs under `timeout`, so even a killed
# test leaves nothing running longer than MINICLUSTER_LIFETIME seconds.
# shellcheck shell=bash

MINICLUSTER_LIFETIME=${MINICLUSTER_LIFETIME:-580}
MC_DIR=''
MC_PIDS=()
MC_CLIENT=()
MC_NODES=()

mc_fail() {
  echo "FAIL: minicluster: $*" >&2
  exit 1
}

# minicluster_check: every prerequisite, with what to do about a missing one.
minicluster_check() {
  [[ $(id -u) -eq 0 ]] ||
    mc_fail "needs root (slurmd runs job steps as the submitting user; munged needs a private key): run as root"
  local c missing=()
  for c in munged munge unmunge slurmctld slurmd sbatch squeue scontrol scancel sinfo srun ss timeout; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  ((${#missing[@]} == 0)) ||
    mc_fail "missing ${missing[*]}: install the Debian packages slurm-wlm munge iproute2 (scripts/setup.sh does)"
}

mc() { "${MC_CLIENT[@]}" "$@"; } # a Slurm client command where the controller is reachable

# mc_free_port: a TCP port nobody listens on, away from the Slurm defaults 6817/6818.
mc_free_port() {
  local p i
  for i in $(seq 1 50); do
    p=$((20000 + (RANDOM * 32768 + RANDOM + i) % 30000))
    if ! ss -Htan 2>/dev/null | awk '{print $4}' | grep -qE "[:.]$p\$"; then
      echo "$p"
      return 0
    fi
  done
  mc_fail "found no free TCP port in 20000-49999"
}

mc_bg() { # mc_bg LOG CMD...: start CMD in the background with a lifetime, remember the pid
  local log=$1
  shift
  timeout -k 5 "$MINICLUSTER_LIFETIME" "$@" >"$log" 2>&1 &
  MC_PIDS+=("$!")
}

mc_dump_logs() {
  local f
  for f in "$MC_DIR"/log/*; do
    [[ -s $f ]] || continue
    echo "----- $f (last 30 lines)" >&2
    tail -n 30 "$f" >&2
  done
}

# mc_munge DIR: private munged (the socket is a file, so every network namespace reaches it).
mc_munge() {
  MC_DIR=$1
  mkdir -p "$MC_DIR"/{munge,state,spool,log}
  chmod 0755 "$MC_DIR" # munged wants its socket folder reachable by everyone
  chmod 0700 "$MC_DIR/munge"
  dd if=/dev/urandom of="$MC_DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$MC_DIR/munge/munge.key"
  mc_bg "$MC_DIR/log/munged.out" munged -F --force --socket="$MC_DIR/munge.sock" --key-file="$MC_DIR/munge/munge.key" \
    --log-file="$MC_DIR/log/munged.log" --pid-file="$MC_DIR/munged.pid" --seed-file="$MC_DIR/munge/seed"
  local i
  for i in $(seq 1 50); do
    [[ -S $MC_DIR/munge.sock ]] && break
    sleep 0.2
  done
  munge -S "$MC_DIR/munge.sock" -n </dev/null | unmunge -S "$MC_DIR/munge.sock" >/dev/null 2>&1 ||
    { mc_dump_logs; mc_fail "munged did not start (logs above)"; }
}

# mc_conf CTL_NAME CTL_ADDR CTL_PORT SLURMD_PORT CPUS NODE=ADDR...: writes DIR/slurm.conf. OverSubscribe lets jobs
# share CPUs; a single job with more tasks than CPUs still needs `sbatch --overcommit` (it stays pending otherwise).
mc_conf() {
  local ctl=$1 ctl_addr=$2 ctl_port=$3 d_port=$4 cpus=$5 n
  shift 5
  MC_NODES=()
  cat >"$MC_DIR/slurm.conf" <<EOF
ClusterName=lbbsptest
SlurmctldHost=$ctl($ctl_addr)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MC_DIR/munge.sock
StateSaveLocation=$MC_DIR/state
SlurmdSpoolDir=$MC_DIR/spool/%n
SlurmctldPidFile=$MC_DIR/slurmctld.pid
SlurmdPidFile=$MC_DIR/slurmd-%n.pid
SlurmctldLogFile=$MC_DIR/log/slurmctld.log
SlurmdLogFile=$MC_DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=5
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
FirstJobId=$((10000 + RANDOM * 30))
EOF
  for n in "$@"; do
    MC_NODES+=("${n%%=*}")
    mkdir -p "$MC_DIR/spool/${n%%=*}"
    echo "NodeName=${n%%=*} NodeAddr=${n#*=} CPUs=$cpus State=UNKNOWN" >>"$MC_DIR/slurm.conf"
  done
  local IFS=,
  echo "PartitionName=test Nodes=${MC_NODES[*]} Default=YES MaxTime=15 State=UP OverSubscribe=FORCE:4" \
    >>"$MC_DIR/slurm.conf"
  export SLURM_CONF=$MC_DIR/slurm.conf
}

mc_wait_idle() { # every node idle within 30 s
  local i states
  for i in $(seq 1 60); do
    states=$(mc timeout 5 sinfo -h -N -o %T 2>/dev/null | sort -u | tr '\n' ' ' || true)
    [[ $states == "idle " ]] && return 0
    sleep 0.5
  done
  mc_dump_logs
  mc_fail "nodes are '${states:-unreachable}', not all idle, 30 s after start (logs above)"
}

minicluster_start() {
  minicluster_check
  mc_munge "$1"
  local node cpus ctld_port slurmd_port
  node=$(hostname -s)
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  ((cpus >= 2)) || cpus=2  # the tests' jobs ask for 2 CPUs; on one core (taskset) its tasks share it (config_overrides)
  ctld_port=$(mc_free_port)
  slurmd_port=$(mc_free_port)
  while [[ $slurmd_port == "$ctld_port" ]]; do slurmd_port=$(mc_free_port); done
  mc_conf "$node" 127.0.0.1 "$ctld_port" "$slurmd_port" "$cpus" "$node=127.0.0.1"
  # Slurm's PMIx plugin keeps per-step folders (spmix_appdir_UID_JOB.STEP) in /tmp: ours go into DIR, so that
  # neither a parallel test cluster nor a killed run's leftovers collide with them.
  mkdir -p "$MC_DIR/pmix"
  echo "PMIxCliTmpDirBase=$MC_DIR/pmix" >"$MC_DIR/mpi.conf"
  mc_bg "$MC_DIR/log/slurmctld.out" slurmctld -D -i -f "$SLURM_CONF"
  mc_bg "$MC_DIR/log/slurmd.out" slurmd -D -N "$node" -f "$SLURM_CONF"
  mc_wait_idle
  echo "minicluster: up in $MC_DIR (node $node, $cpus CPUs, ports $ctld_port/$slurmd_port)"
}

minicluster_start_hosts() {
  minicluster_check
  local hostexec=$2 subnet=$3 n=$4 cpus i nodes=()
  mc_munge "$1"
  MC_CLIENT=("$hostexec" 0)
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  ((cpus >= 2)) || cpus=2  # the tests' jobs ask for 2 CPUs; on one core (taskset) its tasks share it (config_overrides)
  for ((i = 1; i < n; ++i)); do nodes+=("lbbsp-mh-h$i=$subnet.$((i + 1))"); done
  # Each host has its own network, so the default ports are free there.
  mc_conf lbbsp-mh-h0 "$subnet.1" 6817 6818 "$cpus" "${nodes[@]}"
  mc_bg "$MC_DIR/log/slurmctld.out" "$hostexec" 0 slurmctld -D -i -f "$SLURM_CONF"
  for ((i = 1; i < n; ++i)); do
    mc_bg "$MC_DIR/log/slurmd-h$i.out" "$hostexec" "$i" slurmd -D -N "lbbsp-mh-h$i" -f "$SLURM_CONF"
  done
  mc_wait_idle
  echo "minicluster: up in $MC_DIR (controller lbbsp-mh-h0, nodes ${MC_NODES[*]}, $cpus CPUs each)"
}

# minicluster_wait JOBID SECONDS: waits for the job to end; prints its final state; fails on timeout.
minicluster_wait() {
  local job=$1 limit=$2 t0=$SECONDS state=
  while ((SECONDS - t0 < limit)); do
    state=$(mc timeout 10 scontrol -o show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2) || true
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE)
        echo "$state"
        return 0
        ;;
    esac
    sleep 1
  done
  echo "minicluster: job $job still '${state:-unknown}' after ${limit}s:" >&2
  mc timeout 10 scontrol show job "$job" >&2 || true
  mc timeout 10 squeue >&2 || true
  mc_dump_logs
  return 1
}

# minicluster_step_nodes JOB.STEP: the nodes that launched tasks of that step (from the slurmd logs), one per line.
minicluster_step_nodes() {
  local n
  for n in "${MC_NODES[@]}"; do
    grep -q "launch task StepId=$1 " "$MC_DIR/log/slurmd-$n.log" 2>/dev/null && echo "$n"
  done
  return 0
}

# mc_job_pids: processes of this cluster's jobs (their environment names our slurm.conf and a job), wherever they
# went (e.g. an mpirun orphaned when its slurmstepd died).
mc_job_pids() {
  local f pid
  for f in /proc/[0-9]*/environ; do
    pid=${f#/proc/}
    pid=${pid%/environ}
    [[ $pid != "$$" && $pid != "$BASHPID" ]] || continue
    grep -qzx "SLURM_CONF=$MC_DIR/slurm.conf" "$f" 2>/dev/null && grep -qz '^SLURM_JOB_ID=' "$f" 2>/dev/null &&
      echo "$pid"
  done
  return 0
}

# minicluster_teardown DIR: minicluster_stop, then keeps the daemons' logs and slurm.conf in $SCRATCH/daemon-logs
# and removes DIR (the folder given to minicluster_start*): for the tests' EXIT traps.
minicluster_teardown() {
  minicluster_stop || true
  [[ -d $1 ]] || return 0
  mkdir -p "$SCRATCH/daemon-logs"
  cp -r "$1/log/." "$1/slurm.conf" "$SCRATCH/daemon-logs/" 2>/dev/null || true
  rm -rf "$1"
}

minicluster_stop() {
  [[ -n $MC_DIR ]] || return 0
  local i pids
  if [[ -n ${SLURM_CONF:-} ]] && ((${#MC_PIDS[@]} > 1)); then
    mc timeout 10 scancel --full --quiet --partition=test >/dev/null 2>&1 || true
    for i in $(seq 1 20); do # Slurm signals the jobs' processes (KillWait=5 s between TERM and KILL)
      [[ -z $(mc timeout 5 squeue -h -t running,completing 2>/dev/null) && -z $(mc_job_pids) ]] && break
      sleep 0.5
    done
  fi
  local p
  for p in "${MC_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # `timeout` forwards the TERM and follows it with a KILL after 5 s; whatever is left then goes with its group.
  for p in "${MC_PIDS[@]}"; do
    for _ in $(seq 1 80); do
      kill -0 "$p" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL -- "-$p" 2>/dev/null || true
  done
  wait "${MC_PIDS[@]}" 2>/dev/null || true
  pids=$(mc_job_pids)
  if [[ -n $pids ]]; then
    echo "minicluster: killing job processes Slurm left behind: $(echo "$pids" | tr '\n' ' ')" >&2
    # shellcheck disable=SC2086 # one pid per word
    kill -KILL $pids 2>/dev/null || true
  fi
  MC_PIDS=()
  echo "minicluster: stopped"
}
