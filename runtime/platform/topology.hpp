// hwloc: machine topology, this process's CPU binding, and binding a rank to cores.
#pragma once
#include <string>

namespace lbbsp::runtime {

// "1 package, 2 cores, 2 PUs, 1 NUMA node" style summary.
std::string describe_topology();
// The PUs this process is bound to, as a list ("0-1", "3").
std::string current_binding();
int core_count();
// Binds this process to `count` cores starting at core `first` (wrapping around); throws on failure.
void bind_to_cores(int first, int count);

}  // namespace lbbsp::runtime
