// A NumPy array that owns a copy of a vector: what the extension's functions return.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace lbbsp::python {

using I64Out = nanobind::ndarray<nanobind::numpy, int64_t, nanobind::ndim<1>>;

inline I64Out to_numpy(std::vector<int64_t> v) {
  auto* owned = new std::vector<int64_t>(std::move(v));
  nanobind::capsule free_it(owned, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  return I64Out(owned->data(), {owned->size()}, free_it);
}

}  // namespace lbbsp::python
