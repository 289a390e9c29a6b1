// An allocator for cache-line aligned std::vector storage.
#pragma once
#include <cstddef>
#include <new>

namespace lbbsp::predictors {

// Cache-line aligned storage (a NARX window row of 16 floats is then one line, not two).
template <class T>
struct CacheAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAligned() = default;
  template <class U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheAligned<U>&) const {
    return true;
  }
};

}  // namespace lbbsp::predictors
