// The environment libgomp reads when it loads, before main: how long an idle OpenMP thread spins before it
// sleeps. A program sets it when the user left it unset and runs itself again once.
#pragma once
#include <string>
#include <vector>

namespace lbbsp::runtime {

struct EnvSetting {
  std::string name, value;
};

// How long an idle OpenMP thread spins before it sleeps: about what waking a sleeping one costs on a
// virtual machine (35-90 us measured on a 2-core KVM guest; docs/threads.md).
constexpr double kSpinMicroseconds = 50.0;

// libgomp's GOMP_SPINCOUNT for `microseconds` of spinning on this CPU (a spin is a pause instruction and a
// load; a pause takes 3 to 40 ns depending on the CPU), measured over about a millisecond.
long spin_count_for(double microseconds);

// What to set: GOMP_SPINCOUNT when neither it nor OMP_WAIT_POLICY is set; empty otherwise.
std::vector<EnvSetting> kernel_environment();

// Sets kernel_environment() and re-executes this program with the same arguments; returns (changing nothing
// more) when there is nothing to set or the exec fails.
void reexec_with_kernel_environment(char** argv);

}  // namespace lbbsp::runtime
