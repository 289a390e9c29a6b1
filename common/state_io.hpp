// Saved states of predictors and balancers (save_state() / load_state()): a tag naming the kind and its
// format version ("narx/4", "lbbsp-cpu/4"), then the fields in order. Each keeps the encoding its states
// always had:
//   predictor states are binary: the tag and strings length-prefixed (uint64), values as their native bytes;
//   balancer states are text: a line "lbbsp-balancer-state TAG", then one token per value, each followed by a
//     space: integers in decimal, floating point as hex floats (exact, nan and inf included), strings as
//     LENGTH:BYTES.
// A vector is its length, then its values. A reader refuses a state of another kind, and one of another
// format of its kind naming both formats: only the current format is read (docs/checkpoints.md). Header-only,
// like common/spec.hpp.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace lbbsp {

enum class StateOf { predictor, balancer };

namespace state_io_detail {
inline const std::string kTextPrefix = "lbbsp-balancer-state ";  // a text state's first line: this, the tag

// "narx" of "narx/4"; a tag without a version is its own kind ("bsp", and "lbbsp-cpu" of lbbsp-cpu's first
// format).
inline std::string kind_of(const std::string& tag) {
  return tag.substr(0, tag.find('/'));
}
}  // namespace state_io_detail

class StateWriter {
 public:
  StateWriter(StateOf of, const std::string& tag) : of_(of) {
    if (of_ == StateOf::balancer)
      out_ = state_io_detail::kTextPrefix + tag + "\n";
    else
      put_string(tag);
  }
  // Binary: any trivially copyable value; text: integers and floating point.
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(const T& value) {
    if (of_ == StateOf::predictor)
      out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
    else
      put_token(value);
  }
  template <class T, class Alloc>
  void put_vector(const std::vector<T, Alloc>& v) {
    put<uint64_t>(v.size());
    for (const T& x : v) put(x);
  }
  void put_string(const std::string& s) {
    if (of_ == StateOf::predictor) {
      put<uint64_t>(s.size());
      out_ += s;
    } else {
      out_ += std::to_string(s.size()) + ':' + s + ' ';
    }
  }
  const std::string& str() const { return out_; }

 private:
  template <class T>
  void put_token(const T& value) {
    if constexpr (std::is_floating_point_v<T>) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%a ", static_cast<double>(value));  // hex float: exact round trip
      out_ += buf;
    } else if constexpr (std::is_integral_v<T>) {
      out_ += std::to_string(value) + ' ';
    } else {
      throw std::logic_error("a balancer state holds numbers and strings only");
    }
  }
  StateOf of_;
  std::string out_;
};

class StateReader {
 public:
  // Throws std::invalid_argument when `state` was not written with this tag. Keeps a reference to `state`.
  StateReader(StateOf of, const std::string& state, const std::string& tag) : of_(of), in_(state) {
    check_tag(of_ == StateOf::predictor ? get_string() : text_tag(), tag);
  }
  template <class T>
  requires std::is_trivially_copyable_v<T> T get() {
    if (of_ == StateOf::balancer) return get_token<T>();
    need(sizeof(T));
    T value;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  template <class T>
  std::vector<T> get_vector() {
    std::vector<T> v(get_length(sizeof(T)));
    for (auto& x : v) x = get<T>();
    return v;
  }
  std::string get_string() { return of_ == StateOf::predictor ? binary_string() : text_string(); }
  // Throws when bytes are left over (a predictor state ends where its last field does).
  void finish() const {
    if (pos_ != in_.size()) fail(" has trailing bytes");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument((of_ == StateOf::predictor ? "predictor state" : "balancer state") + what);
  }
  void need(uint64_t n) const {
    if (n > in_.size() - pos_) fail(" is truncated");
  }
  void check_tag(const std::string& saved, const std::string& tag) const;
  std::string text_tag();
  uint64_t get_length(size_t value_size);
  std::string binary_string();
  std::string text_string();
  std::string token();
  template <class T>
  T get_token();

  StateOf of_;
  const std::string& in_;
  size_t pos_ = 0;
};

// Another kind is "not a 'TAG' state"; another format of the same kind names both formats and the way out.
inline void StateReader::check_tag(const std::string& saved, const std::string& tag) const {
  if (saved == tag) return;
  if (saved.empty() || state_io_detail::kind_of(saved) != state_io_detail::kind_of(tag))
    fail(" is not a '" + tag + "' state");
  fail(" has format '" + saved + "', this lbbsp reads '" + tag +
       "' only (other formats are not converted: docs/checkpoints.md); start afresh instead of loading it "
       "(lbbsp train: run without --resume, or with a new --checkpoint-dir)");
}

// The tag on a text state's first line, or "" when it has none.
inline std::string StateReader::text_tag() {
  const std::string& prefix = state_io_detail::kTextPrefix;
  const size_t end = in_.find('\n', prefix.size());
  if (in_.compare(0, prefix.size(), prefix) != 0 || end == std::string::npos) return "";
  pos_ = end + 1;
  return in_.substr(prefix.size(), end - prefix.size());
}

// A vector's length, checked against the bytes left before anything is allocated.
inline uint64_t StateReader::get_length(size_t value_size) {
  if (of_ == StateOf::predictor) {
    const uint64_t n = get<uint64_t>();
    if (n > (in_.size() - pos_) / value_size) fail(" is truncated");
    return n;
  }
  const int64_t n = get_token<int64_t>();
  if (n < 0 || static_cast<uint64_t>(n) > in_.size()) fail(": bad vector length");
  return static_cast<uint64_t>(n);
}

inline std::string StateReader::binary_string() {
  const uint64_t n = get<uint64_t>();
  need(n);
  std::string s = in_.substr(pos_, n);
  pos_ += n;
  return s;
}

inline std::string StateReader::text_string() {
  const size_t colon = in_.find(':', pos_);
  if (colon == std::string::npos) fail(" is truncated");
  const size_t len = std::stoull(in_.substr(pos_, colon - pos_));
  if (colon + 1 + len + 1 > in_.size()) fail(" is truncated");
  std::string s = in_.substr(colon + 1, len);
  pos_ = colon + 1 + len + 1;
  return s;
}

inline std::string StateReader::token() {
  const size_t end = in_.find(' ', pos_);
  if (end == std::string::npos) fail(" is truncated");
  std::string t = in_.substr(pos_, end - pos_);
  pos_ = end + 1;
  return t;
}

template <class T>
T StateReader::get_token() {
  const std::string t = token();
  char* end = nullptr;
  if constexpr (std::is_floating_point_v<T>) {
    const double v = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0') fail(": bad number '" + t + "'");
    return static_cast<T>(v);
  } else if constexpr (std::is_integral_v<T>) {
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || static_cast<long long>(static_cast<T>(v)) != v)
      fail(": bad integer '" + t + "'");
    return static_cast<T>(v);
  } else {
    throw std::logic_error("a balancer state holds numbers and strings only");
  }
}

}  // namespace lbbsp
