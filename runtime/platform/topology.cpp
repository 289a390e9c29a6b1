#include "runtime/platform/topology.hpp"

#include <hwloc.h>

#include <cstdlib>
#include <stdexcept>

namespace lbbsp::runtime {

namespace {
struct Topology {
  hwloc_topology_t t;
  Topology() {
    hwloc_topology_init(&t);
    hwloc_topology_load(t);
  }
  ~Topology() { hwloc_topology_destroy(t); }
};
std::string bitmap_list(hwloc_const_bitmap_t b) {
  char* s = nullptr;
  hwloc_bitmap_list_asprintf(&s, b);
  std::string out = s ? s : "";
  std::free(s);
  return out;
}
}  // namespace

std::string describe_topology() {
  Topology topo;
  auto count = [&](hwloc_obj_type_t type) { return hwloc_get_nbobjs_by_type(topo.t, type); };
  return std::to_string(count(HWLOC_OBJ_PACKAGE)) + " package(s), " + std::to_string(count(HWLOC_OBJ_CORE)) +
         " core(s), " + std::to_string(count(HWLOC_OBJ_PU)) + " PU(s), " +
         std::to_string(count(HWLOC_OBJ_NUMANODE)) + " NUMA node(s)";
}

int core_count() {
  Topology topo;
  int n = hwloc_get_nbobjs_by_type(topo.t, HWLOC_OBJ_CORE);
  return n > 0 ? n : 1;
}

std::string current_binding() {
  Topology topo;
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  std::string out = "unknown";
  if (hwloc_get_cpubind(topo.t, set, HWLOC_CPUBIND_PROCESS) == 0) out = "PUs " + bitmap_list(set);
  hwloc_bitmap_free(set);
  return out;
}

void bind_to_cores(int first, int count) {
  Topology topo;
  int cores = hwloc_get_nbobjs_by_type(topo.t, HWLOC_OBJ_CORE);
  if (cores <= 0) throw std::runtime_error("--bind core: hwloc found no cores");
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  for (int i = 0; i < count; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo.t, HWLOC_OBJ_CORE, (first + i) % cores);
    hwloc_bitmap_or(set, set, core->cpuset);
  }
  int rc = hwloc_set_cpubind(topo.t, set, HWLOC_CPUBIND_PROCESS);
  hwloc_bitmap_free(set);
  if (rc != 0) throw std::runtime_error("--bind core: hwloc could not bind this rank to its cores");
}

}  // namespace lbbsp::runtime
