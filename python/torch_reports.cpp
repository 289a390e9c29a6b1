// lbbsp.torch's report rows (the layout, defined here once: lbbsp/torch/report.py reads it): a rank's row
// encoded, written into the block that rides in a gradient allreduce and read back, and the step's decision
// from the world's rows in one call. In a training step each NumPy call costs microseconds with the caches
// cold: in Python these took 200-250 us of a rank's CPU a step (2 ranks, a 50 ms step), here a few calls do
// them.
#include "python/torch_reports.hpp"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/hash.hpp"
#include "lbbsp/core.hpp"
#include "python/numpy_out.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace lbbsp::python {
namespace {

using balancer::Balancer;
using balancer::IterationReport;

// The row: batch, compute seconds, exo..., memory cap, measured batch, status, checksum of the batch vector.
constexpr size_t kExo = balancer::kRankExo.size();
constexpr size_t kBatch = 0, kComputeS = 1, kFirstExo = 2, kMemCap = 2 + kExo, kMeasured = 3 + kExo,
                 kStatus = 4 + kExo, kChecksum = 5 + kExo, kWidth = 6 + kExo;

using Rows = nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Sizes = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Row = nb::ndarray<const double, nb::shape<kWidth>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Block = nb::ndarray<T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
// The checksum every report carries: FNV-1a (common/hash.hpp) of the batch vector's int64 bytes, folded to 32
// bits, exact in float64 and, as two 16-bit halves, in float32. Ranks that used different vectors show
// different checksums (two vectors hash alike by a chance of 2^-32); a hash of our own keeps the wheel free
// of zlib.
double sizes_checksum(const int64_t* sizes, size_t n) {
  const uint64_t h = fnv1a64(sizes, n * sizeof(int64_t));
  return static_cast<double>(static_cast<uint32_t>(h ^ (h >> 32)));
}
double sizes_checksum(const Sizes& sizes) {
  return sizes_checksum(sizes.data(), sizes.shape(0));
}

F64Out encode_report(int64_t batch, double compute_s, const std::vector<double>& exo, int64_t mem_cap,
                     int64_t measured_batch, bool failed, const Sizes& sizes) {
  if (exo.size() != kExo)
    throw std::invalid_argument("encode_report: exo must have " + std::to_string(kExo) + " figures");
  std::vector<double> row(kWidth);
  row[kBatch] = static_cast<double>(batch);
  row[kComputeS] = compute_s;
  std::copy(exo.begin(), exo.end(), row.begin() + kFirstExo);
  row[kMemCap] = static_cast<double>(mem_cap);
  row[kMeasured] = static_cast<double>(measured_batch);
  row[kStatus] = failed ? 1.0 : 0.0;
  row[kChecksum] = sizes_checksum(sizes);
  return owned(std::move(row), {kWidth});
}

// A world x (kWidth + 1) block: zeros, and `row` in row `rank` with its checksum as two 16-bit halves (exact
// in float32), so that the SUM over the ranks' blocks holds every row.
template <typename T>
void write_block(Block<T> block, size_t rank, const Row& row) {
  if (block.shape(1) != kWidth + 1 || rank >= block.shape(0))
    throw std::invalid_argument("write_report_block: the block must be world x " +
                                std::to_string(kWidth + 1) + " with the rank's row in it");
  std::fill(block.data(), block.data() + block.size(), T(0));
  T* out = block.data() + rank * (kWidth + 1);
  for (size_t c = 0; c < kChecksum; ++c) out[c] = static_cast<T>(row(c));
  const auto sum = static_cast<uint32_t>(row(kChecksum));
  out[kChecksum] = static_cast<T>(sum >> 16), out[kChecksum + 1] = static_cast<T>(sum & 0xFFFFu);
}

// The world x kWidth float64 rows of a summed block (a copy: the block is reused).
template <typename T>
F64Out read_block(Block<const T> block) {
  if (block.shape(1) != kWidth + 1)
    throw std::invalid_argument("read_report_block: the block must be world x " + std::to_string(kWidth + 1));
  const size_t world = block.shape(0);
  std::vector<double> rows(world * kWidth);
  for (size_t i = 0; i < world; ++i) {
    const T* in = block.data() + i * (kWidth + 1);
    double* out = rows.data() + i * kWidth;
    for (size_t c = 0; c < kChecksum; ++c) out[c] = static_cast<double>(in[c]);
    out[kChecksum] = static_cast<double>(in[kChecksum]) * 65536.0 + static_cast<double>(in[kChecksum + 1]);
  }
  return owned(std::move(rows), {world, kWidth});
}

// The world's rows (world x kWidth, row-major): a summed block as read, from NumPy or from a C++ caller.
struct RowsView {
  const double* data;
  size_t world;
  double operator()(size_t i, size_t c) const { return data[i * kWidth + c]; }
};

// Whether every row is a built report (status 0) of the batch `expected` gives it, all of one batch vector
// (checksum) and measured (a window of >= 0 samples): what the fast path decides from.
bool usual(RowsView rows, const int64_t* expected) {
  const double checksum = rows(0, kChecksum);
  for (size_t i = 0; i < rows.world; ++i)
    if (rows(i, kStatus) != 0 || rows(i, kChecksum) != checksum ||
        rows(i, kBatch) != static_cast<double>(expected[i]) || rows(i, kMeasured) < 0)
      return false;
  return true;
}

// The balancer's report: each rank's measured batch and seconds, its exo figures (also as the coming step's,
// which is all a rank knows of it), its memory cap where it gave one (0: none).
IterationReport iteration_report(int64_t iteration, RowsView rows) {
  IterationReport r;
  r.iteration = iteration;
  r.workers.resize(rows.world);
  for (size_t i = 0; i < rows.world; ++i) {
    auto& w = r.workers[i];
    w.batch = static_cast<int64_t>(rows(i, kMeasured));
    w.compute_s = rows(i, kComputeS);
    w.exo.resize(kExo);
    for (size_t e = 0; e < kExo; ++e) w.exo[e] = rows(i, kFirstExo + e);
    w.exo_next = w.exo;
    if (rows(i, kMemCap) > 0) w.mem_cap = static_cast<int64_t>(rows(i, kMemCap));
  }
  return r;
}

// decide_from_reports as a C function, for lbbsp.torch's C++ step path (lbbsp/torch/native_step.cpp, another
// extension, which gets its address from Balancer.c_decider()): 1 decided (`out` holds the world's sizes,
// `checksum` theirs), 0 a row not the usual (nothing changed), -1 the decision failed (`error` says
// "ValueError: ..." or "RuntimeError: ...", as the Python call would raise).
int decide_rows(void* balancer, int64_t iteration, const double* rows, int64_t world, int64_t width,
                const int64_t* expected, int64_t* out, double* checksum, char* error,
                size_t error_len) noexcept {
  auto fail = [&](const char* kind, const char* what) {
    std::snprintf(error, error_len, "%s: %s", kind, what);
    return -1;
  };
  if (width != static_cast<int64_t>(kWidth) || world <= 0) return fail("ValueError", "decide_rows: bad rows");
  const RowsView view{rows, static_cast<size_t>(world)};
  if (!usual(view, expected)) return 0;
  try {
    const std::vector<int64_t> sizes =
        static_cast<Balancer*>(balancer)->next(iteration_report(iteration, view));
    if (sizes.size() != view.world)
      return fail("RuntimeError", "decide_rows: the balancer's vector has another size");
    std::copy(sizes.begin(), sizes.end(), out);
    *checksum = sizes_checksum(out, view.world);
    return 1;
  } catch (const std::invalid_argument& e) {
    return fail("ValueError", e.what());
  } catch (const std::exception& e) {
    return fail("RuntimeError", e.what());
  }
}

}  // namespace

void bind_torch_reports(nb::module_& m) {
  nb::dict layout;
  for (const auto& [name, column] : {std::pair<const char*, size_t>{"batch", kBatch},
                                     {"compute_s", kComputeS},
                                     {"exo", kFirstExo},
                                     {"mem_cap", kMemCap},
                                     {"measured_batch", kMeasured},
                                     {"status", kStatus},
                                     {"checksum", kChecksum},
                                     {"width", kWidth}})
    layout[name] = column;
  m.attr("REPORT_LAYOUT") = layout;
  m.def("encode_report", &encode_report, "batch"_a, "compute_s"_a, "exo"_a, "mem_cap"_a, "measured_batch"_a,
        "failed"_a, "sizes"_a, "A rank's report row (float64), the checksum of `sizes` in its column.");
  m.def("sizes_checksum", nb::overload_cast<const Sizes&>(&sizes_checksum), "sizes"_a,
        "The 32-bit checksum of an int64 batch vector (FNV-1a, folded).");
  m.def("write_report_block", &write_block<float>, "block"_a, "rank"_a, "row"_a);
  m.def("write_report_block", &write_block<double>, "block"_a, "rank"_a, "row"_a,
        "Zeros the world x (width + 1) block and writes `row` in row `rank`, the checksum as two 16-bit "
        "halves.");
  m.def("read_report_block", &read_block<float>, "block"_a);
  m.def("read_report_block", &read_block<double>, "block"_a,
        "The world x width float64 rows of a summed block that write_report_block filled on each rank.");
  m.def(
      "decide_from_reports",
      [](Balancer& b, int64_t iteration, const Rows& rows, const Sizes& expected) -> nb::object {
        if (rows.shape(1) != kWidth || rows.shape(0) != expected.shape(0) || rows.shape(0) == 0)
          throw std::invalid_argument("decide_from_reports: rows must be workers x " +
                                      std::to_string(kWidth) + " and expected one size per worker");
        const RowsView view{rows.data(), rows.shape(0)};
        if (!usual(view, expected.data())) return nb::none();
        return nb::cast(to_numpy(b.next(iteration_report(iteration, view))));
      },
      "balancer"_a, "iteration"_a, "rows"_a, "expected"_a,
      "Step `iteration`'s decision from the world's report rows, or None where a row is not the usual "
      "(failed, "
      "another batch vector or batch, not measured): the caller's checks then name what.");
  m.def(
      "report_decider",
      [](Balancer& b) {
        return std::pair<uintptr_t, uintptr_t>{reinterpret_cast<uintptr_t>(&decide_rows),
                                               reinterpret_cast<uintptr_t>(&b)};
      },
      "balancer"_a,
      "(decide_rows's address, the balancer's): decide_from_reports as a C function for a C++ caller that "
      "holds the balancer alive meanwhile.");
}

}  // namespace lbbsp::python
