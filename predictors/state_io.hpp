// Binary (bit-exact) serialisation helpers for predictor checkpoints, and small shared utilities.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace lbbsp::predictors {

// A usable speed observation: finite and strictly positive (everything else is "bad or missing").
inline bool is_good_speed(double v) {
  return std::isfinite(v) && v > 0.0;
}

// Prediction returned before any good observation (equal shares for every worker).
inline constexpr double kDefaultSpeed = 1.0;

class StateWriter {
 public:
  explicit StateWriter(const std::string& tag) { put_string(tag); }
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(const T& value) { out_.append(reinterpret_cast<const char*>(&value), sizeof(T)); }
  template <class T, class Alloc>
  void put_vector(const std::vector<T, Alloc>& v) {
    put<uint64_t>(v.size());
    for (const T& x : v) put(x);
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    out_ += s;
  }
  std::string str() const { return out_; }

 private:
  std::string out_;
};

class StateReader {
 public:
  // Throws std::invalid_argument when the state was saved by another predictor kind.
  StateReader(const std::string& state, const std::string& tag) : in_(state) {
    if (get_string() != tag) throw std::invalid_argument("predictor state is not a '" + tag + "' state");
  }
  template <class T>
  requires std::is_trivially_copyable_v<T> T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  template <class T>
  std::vector<T> get_vector() {
    uint64_t n = get<uint64_t>();
    need(n * sizeof(T));
    std::vector<T> v(n);
    for (auto& x : v) x = get<T>();
    return v;
  }
  std::string get_string() {
    uint64_t n = get<uint64_t>();
    need(n);
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  void finish() const {
    if (pos_ != in_.size()) throw std::invalid_argument("predictor state has trailing bytes");
  }

 private:
  void need(uint64_t n) const {
    if (n > in_.size() - pos_) throw std::invalid_argument("predictor state is truncated");
  }
  const std::string& in_;
  size_t pos_ = 0;
};

// splitmix64: tiny, portable and fully determined by one 64-bit word (easy to checkpoint).
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
