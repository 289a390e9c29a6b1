// Exact, binary-safe text serialisation for balancer checkpoints (doubles as hex floats, strings
// length-prefixed).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lbbsp::balancer {

class StateWriter {
 public:
  explicit StateWriter(const std::string& tag);
  void i64(int64_t v);
  void f64(double v);
  void str(const std::string& s);
  void i64s(const std::vector<int64_t>& v);
  void f64s(const std::vector<double>& v);
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// Whether `state` was written with this tag (a balancer that reads older formats picks its reader with it).
bool state_has_tag(const std::string& state, const std::string& tag);

class StateReader {
 public:
  // Throws std::invalid_argument when the state was not written with this tag.
  StateReader(const std::string& state, const std::string& tag);
  int64_t i64();
  double f64();
  std::string str();
  std::vector<int64_t> i64s();
  std::vector<double> f64s();

 private:
  std::string token();
  const std::string& in_;
  size_t pos_ = 0;
};

}  // namespace lbbsp::balancer
