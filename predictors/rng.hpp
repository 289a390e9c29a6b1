// The predictors' random numbers: splitmix64, tiny, portable and fully determined by one 64-bit word (easy to
// checkpoint).
#pragma once
#include <cmath>
#include <cstdint>

namespace lbbsp::predictors {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Box-Muller; portable across standard libraries unlike std::normal_distribution.
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  // Like below(n) by a multiply-shift instead of a division (Lemire): a few times cheaper, bias < n / 2^64.
  uint64_t below_fast(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

}  // namespace lbbsp::predictors
