# A throw-away single-node Slurm (munged + slurmctld + slurmd) for tests. Source it, then:
#   minicluster_start DIR     # DIR: a fresh, short path (unix sockets live there); exports SLURM_CONF
#   ... sbatch / squeue / scontrol ...
#   minicluster_stop          # idempotent; call it from an EXIT trap
# Root only (slurmd starts job steps as the submitting user). Nothing system-wide is touched: own munge key and
# socket, own ports, state and spool under DIR, config in DIR/slurm.conf. Every daemon runs under `timeout`, so
# even a killed test leaves nothing running longer than MINICLUSTER_LIFETIME seconds.
# shellcheck shell=bash

MINICLUSTER_LIFETIME=${MINICLUSTER_LIFETIME:-580}
MC_DIR=''
MC_PIDS=()

mc_fail() {
  echo "FAIL: minicluster: $*" >&2
  exit 1
}

# minicluster_check: every prerequisite, with what to do about a missing one.
minicluster_check() {
  [[ $(id -u) -eq 0 ]] ||
    mc_fail "needs root (slurmd runs job steps as the submitting user; munged needs a private key): run as root"
  local c missing=()
  for c in munged munge slurmctld slurmd sbatch squeue scontrol scancel sinfo srun ss timeout; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  ((${#missing[@]} == 0)) ||
    mc_fail "missing ${missing[*]}: install the Debian packages slurm-wlm munge iproute2 (scripts/setup.sh does)"
}

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

minicluster_start() {
  minicluster_check
  MC_DIR=$1
  mkdir -p "$MC_DIR"/{munge,state,spool,log}
  chmod 0755 "$MC_DIR" # munged wants its socket folder reachable by everyone
  chmod 0700 "$MC_DIR/munge"
  dd if=/dev/urandom of="$MC_DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$MC_DIR/munge/munge.key"
  MC_NODE=$(hostname -s)
  MC_CPUS=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  local ctld_port slurmd_port
  ctld_port=$(mc_free_port)
  slurmd_port=$(mc_free_port)
  while [[ $slurmd_port == "$ctld_port" ]]; do slurmd_port=$(mc_free_port); done

  mc_bg "$MC_DIR/log/munged.out" munged -F --force --socket="$MC_DIR/munge.sock" --key-file="$MC_DIR/munge/munge.key" \
    --log-file="$MC_DIR/log/munged.log" --pid-file="$MC_DIR/munged.pid" --seed-file="$MC_DIR/munge/seed"
  local i
  for i in $(seq 1 50); do
    [[ -S $MC_DIR/munge.sock ]] && break
    sleep 0.2
  done
  munge -S "$MC_DIR/munge.sock" -n </dev/null | unmunge -S "$MC_DIR/munge.sock" >/dev/null 2>&1 ||
    { mc_dump_logs; mc_fail "munged did not start (logs above)"; }

  # proctrack/linuxproc + task/none: no cgroups needed; OverSubscribe lets jobs share the node's CPUs. A single job
  # with more tasks than CPUs still needs `sbatch --overcommit` (Slurm keeps it pending otherwise).
  cat >"$MC_DIR/slurm.conf" <<EOF
ClusterName=lbbsptest
SlurmctldHost=$MC_NODE(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MC_DIR/munge.sock
StateSaveLocation=$MC_DIR/state
SlurmdSpoolDir=$MC_DIR/spool
SlurmctldPidFile=$MC_DIR/slurmctld.pid
SlurmdPidFile=$MC_DIR/slurmd.pid
SlurmctldLogFile=$MC_DIR/log/slurmctld.log
SlurmdLogFile=$MC_DIR/log/slurmd.log
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
NodeName=$MC_NODE NodeAddr=127.0.0.1 CPUs=$MC_CPUS State=UNKNOWN
PartitionName=test Nodes=$MC_NODE Default=YES MaxTime=15 State=UP OverSubscribe=FORCE:4
EOF
  export SLURM_CONF=$MC_DIR/slurm.conf
  mc_bg "$MC_DIR/log/slurmctld.out" slurmctld -D -i -f "$SLURM_CONF"
  mc_bg "$MC_DIR/log/slurmd.out" slurmd -D -N "$MC_NODE" -f "$SLURM_CONF"
  local state=
  for i in $(seq 1 60); do
    state=$(timeout 5 sinfo -h -n "$MC_NODE" -o %T 2>/dev/null || true)
    [[ $state == idle ]] && break
    sleep 0.5
  done
  [[ $state == idle ]] ||
    { mc_dump_logs; mc_fail "node $MC_NODE is '${state:-unreachable}', not idle, 30 s after start (logs above)"; }
  echo "minicluster: up in $MC_DIR (node $MC_NODE, $MC_CPUS CPUs, ports $ctld_port/$slurmd_port)"
}

# minicluster_wait JOBID SECONDS: waits for the job to end; prints its final state; fails on timeout.
minicluster_wait() {
  local job=$1 limit=$2 t0=$SECONDS state=
  while ((SECONDS - t0 < limit)); do
    state=$(timeout 10 scontrol -o show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2) || true
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE)
        echo "$state"
        return 0
        ;;
    esac
    sleep 1
  done
  echo "minicluster: job $job still '${state:-unknown}' after ${limit}s:" >&2
  timeout 10 scontrol show job "$job" >&2 || true
  timeout 10 squeue >&2 || true
  mc_dump_logs
  return 1
}

minicluster_stop() {
  [[ -n $MC_DIR ]] || return 0
  if [[ -n ${SLURM_CONF:-} ]] && ((${#MC_PIDS[@]} > 1)); then
    timeout 10 scancel --full --quiet --partition=test >/dev/null 2>&1 || true
    local i
    for i in $(seq 1 20); do
      [[ -z $(timeout 5 squeue -h -t running,completing 2>/dev/null) ]] && break
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
  MC_PIDS=()
  echo "minicluster: stopped"
}
