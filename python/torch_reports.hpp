// lbbsp.torch's report rows and the per-step decision from them (torch_reports.cpp).
#pragma once
#include <nanobind/nanobind.h>

namespace lbbsp::python {

// REPORT_LAYOUT (the row's columns) and decide_from_reports(balancer, iteration, rows, expected).
void bind_torch_reports(nanobind::module_& m);

}  // namespace lbbsp::python
