// Graceful stop on SIGTERM, SIGINT and SIGUSR1 (a Slurm time limit or preemption, `sbatch --signal=USR1@120`,
// Ctrl-C): the first one only sets a flag, which the trainer carries to every rank in the gradient allreduce,
// so all ranks finish the iteration, write a checkpoint and exit together. Another of them later than
// kStopRepeatGraceSeconds after the first kills as usual; one sooner is the same stop delivered twice and is
// ignored (at a Slurm time limit every srun-launched rank gets SIGTERM twice in a moment).
#pragma once

namespace lbbsp::runtime {

inline constexpr double kStopRepeatGraceSeconds = 2.0;

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  int received() const;  // the first signal received since construction, 0 if none
};

const char* signal_name(int sig);  // "SIGTERM", ...

}  // namespace lbbsp::runtime
