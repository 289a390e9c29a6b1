// lbbsp._lbbsp: the core's balancers, predictors and sampling functions for Python. Thin on purpose: the
// package's Python layer (lbbsp/__init__.py) checks and converts arguments and gives the messages; this file
// only moves flat arrays in and out of the C++ types. C++ exceptions become Python ones (invalid_argument ->
// ValueError).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "lbbsp/core.hpp"
#include "python/numpy_out.hpp"
#include "python/torch_reports.hpp"
#include "runtime/monitor.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using lbbsp::balancer::Balancer;
using lbbsp::balancer::BalancerConfig;
using lbbsp::balancer::IterationReport;
using lbbsp::predictors::Predictor;

namespace {

using I64Array = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F64Array = nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using lbbsp::python::to_numpy;

std::span<const int64_t> span_of(const I64Array& a) {
  return {a.data(), a.shape(0)};
}

nb::bytes to_bytes(const std::string& s) {
  return nb::bytes(s.data(), s.size());
}
std::string from_bytes(const nb::bytes& b) {
  return std::string(b.c_str(), b.size());
}

// One iteration's report from flat per-worker arrays (exo and exo_next are row-major n x k; empty = absent).
IterationReport make_report(int64_t iteration, const I64Array& batch, const F64Array& compute_s,
                            const F64Array& exo, const F64Array& exo_next, const I64Array& mem_cap,
                            const F64Array& capacity, const F64Array& capacity_next) {
  const size_t n = batch.shape(0);
  const size_t k = n ? exo.shape(0) / n : 0, k_next = n ? exo_next.shape(0) / n : 0;
  IterationReport r;
  r.iteration = iteration;
  r.workers.resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto& w = r.workers[i];
    w.batch = batch(i);
    w.compute_s = compute_s(i);
    w.exo.assign(exo.data() + i * k, exo.data() + (i + 1) * k);
    w.exo_next.assign(exo_next.data() + i * k_next, exo_next.data() + (i + 1) * k_next);
    if (mem_cap.shape(0)) w.mem_cap = mem_cap(i);
    if (capacity.shape(0)) w.truth.capacity = capacity(i);
    if (capacity_next.shape(0)) w.truth.capacity_next = capacity_next(i);
  }
  return r;
}

void bind_balancer(nb::module_& m) {
  nb::class_<BalancerConfig>(m, "BalancerConfig")
      .def(nb::init<>())
      .def_rw("name", &BalancerConfig::name)
      .def_rw("predictor", &BalancerConfig::predictor)
      .def_rw("workers", &BalancerConfig::workers)
      .def_rw("global_batch", &BalancerConfig::global_batch)
      .def_rw("min_batch", &BalancerConfig::min_batch)
      .def_rw("num_exo", &BalancerConfig::num_exo)
      .def_rw("capacity_exo", &BalancerConfig::capacity_exo)
      .def_rw("seed", &BalancerConfig::seed)
      .def_rw("mem_cap", &BalancerConfig::mem_cap);

  nb::class_<Balancer>(m, "Balancer")
      .def_prop_ro("name", &Balancer::name)
      .def("initial", [](Balancer& b) { return to_numpy(b.initial()); })
      .def(
          "next",
          [](Balancer& b, int64_t iteration, const I64Array& batch, const F64Array& compute_s,
             const F64Array& exo, const F64Array& exo_next, const I64Array& mem_cap, const F64Array& capacity,
             const F64Array& capacity_next) {
            const IterationReport r =
                make_report(iteration, batch, compute_s, exo, exo_next, mem_cap, capacity, capacity_next);
            nb::gil_scoped_release quiet;  // the decision may take a while for large fleets
            return b.next(r);
          },
          "iteration"_a, "batch"_a, "compute_s"_a, "exo"_a, "exo_next"_a, "mem_cap"_a, "capacity"_a,
          "capacity_next"_a)
      .def("predicted_speeds", &Balancer::predicted_speeds)
      .def("noise_band", &Balancer::noise_band)
      .def("save_state", [](const Balancer& b) { return to_bytes(b.save_state()); })
      .def("load_state", [](Balancer& b, const nb::bytes& s) { b.load_state(from_bytes(s)); });

  m.def("make_balancer", &lbbsp::balancer::make_balancer, "config"_a);
}

void bind_predictor(nb::module_& m) {
  nb::class_<Predictor>(m, "Predictor")
      .def_prop_ro("name", &Predictor::name)
      .def("observe", &Predictor::observe, "speed"_a, "exo"_a)
      .def("predict", &Predictor::predict, "exo_next"_a)
      .def("set_truth", &Predictor::set_truth, "next_speed"_a)
      .def("save_state", [](const Predictor& p) { return to_bytes(p.save_state()); })
      .def("load_state", [](Predictor& p, const nb::bytes& s) { p.load_state(from_bytes(s)); });
  m.def("make_predictor", &lbbsp::predictors::make_predictor, "spec"_a, "num_exo"_a, "seed"_a);
}

void bind_sampling(nb::module_& m) {
  namespace lb = lbbsp::balancer;
  m.def(
      "epoch_permutation",
      [](int64_t n, uint64_t seed, int64_t epoch) { return to_numpy(lb::epoch_permutation(n, seed, epoch)); },
      "n"_a, "seed"_a, "epoch"_a);
  m.def(
      "rank_indices",
      [](const I64Array& perm, int64_t step, const I64Array& batch, int rank) {
        return to_numpy(lb::rank_indices(span_of(perm), step, span_of(batch), rank));
      },
      "permutation"_a, "step"_a, "batch"_a, "rank"_a);
  m.def(
      "slice_offset", [](const I64Array& batch, int rank) { return lb::slice_offset(span_of(batch), rank); },
      "batch"_a, "rank"_a);
  m.def("steps_per_epoch", &lb::steps_per_epoch, "n"_a, "global_batch"_a);
  m.def(
      "check_batch",
      [](const std::vector<int64_t>& batch, int64_t global_batch, const std::vector<int64_t>& min,
         const std::vector<int64_t>& max) {
        lb::check_batch(batch, global_batch, {min, max}, batch.size());
      },
      "batch"_a, "global_batch"_a, "min"_a, "max"_a);
  m.def(
      "assign_by_speed",
      [](const std::vector<double>& speeds, int64_t global_batch, const std::vector<int64_t>& min,
         const std::vector<int64_t>& max) {
        return to_numpy(lb::assign_by_speed(speeds, global_batch, {min, max}));
      },
      "speeds"_a, "global_batch"_a, "min"_a, "max"_a);
}

// The names and inputs the Python layer must agree with the C++ on: read from here, never copied.
void bind_names(nb::module_& m) {
  namespace lb = lbbsp::balancer;
  m.def("balancer_kinds", &lb::balancer_kinds);
  m.def("predictor_kinds", &lbbsp::predictors::predictor_kinds);
  m.attr("RANK_EXO") = std::vector<std::string>(lb::kRankExo.begin(), lb::kRankExo.end());
  m.attr("RANK_CAPACITY_EXO") = lb::kRankCapacityExo;
}

// The monitor as a C function for lbbsp.torch's C++ step path (lbbsp/torch/native_step.cpp, another
// extension): fills [cpu_avail, mem_avail, load] in RANK_EXO's order; 0 on success.
int sample_monitor(void* monitor, double* out) noexcept {
  try {
    const auto s = static_cast<lbbsp::runtime::ResourceMonitor*>(monitor)->sample();
    out[0] = s.cpu_avail, out[1] = s.mem_avail, out[2] = s.load;
    return 0;
  } catch (...) {
    return 1;
  }
}

// The runtime's /proc monitor (runtime/monitor.cpp), so that lbbsp.torch measures exactly as `lbbsp train`.
void bind_monitor(nb::module_& m) {
  using lbbsp::runtime::ResourceMonitor;
  nb::class_<ResourceMonitor>(m, "ResourceMonitor")
      .def(nb::init<>())
      .def("sample",
           [](ResourceMonitor& monitor) {
             const auto s = monitor.sample();
             return std::vector<double>{s.cpu_avail, s.mem_avail, s.load};  // in RANK_EXO's order
           })
      // (sample_monitor's address, this monitor's): for a C++ caller that holds this object alive meanwhile
      .def("c_sampler", [](ResourceMonitor& monitor) {
        return std::pair<uintptr_t, uintptr_t>{reinterpret_cast<uintptr_t>(&sample_monitor),
                                               reinterpret_cast<uintptr_t>(&monitor)};
      });
}

}  // namespace

NB_MODULE(_lbbsp, m) {
  m.doc() = "C++ core of lbbsp (balancers, predictors, sampling); use the lbbsp package, not this module.";
  m.attr("__version__") = LBBSP_VERSION_STRING;
  // Balancers held by objects still alive at interpreter exit (a DDP hook's closure, a user's global) are not
  // leaks worth a warning on every run's stderr.
  nb::set_leak_warnings(false);
  bind_balancer(m);
  bind_predictor(m);
  bind_sampling(m);
  bind_names(m);
  bind_monitor(m);
  lbbsp::python::bind_torch_reports(m);
}
