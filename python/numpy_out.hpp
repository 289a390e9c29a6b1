// NumPy arrays that own a vector: what the extension's functions return.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace lbbsp::python {

using I64Out = nanobind::ndarray<nanobind::numpy, int64_t, nanobind::ndim<1>>;
using F64Out = nanobind::ndarray<nanobind::numpy, double>;

// A NumPy array of `shape` (default: 1-D) that owns `v`.
template <typename T>
nanobind::ndarray<nanobind::numpy, T> owned(std::vector<T> v, std::initializer_list<size_t> shape = {}) {
  auto* kept = new std::vector<T>(std::move(v));
  nanobind::capsule free_it(kept, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const size_t flat[1] = {kept->size()};
  return {kept->data(), shape.size() ? shape.size() : 1, shape.size() ? shape.begin() : flat, free_it};
}

inline I64Out to_numpy(std::vector<int64_t> v) {
  return I64Out(owned(std::move(v)));
}

}  // namespace lbbsp::python
