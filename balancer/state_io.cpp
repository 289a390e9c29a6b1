#include "balancer/state_io.hpp"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace lbbsp::balancer {

namespace {
std::string header_of(const std::string& tag) {
  return "lbbsp-balancer-state " + tag + "\n";
}
}  // namespace

StateWriter::StateWriter(const std::string& tag) : out_(header_of(tag)) {}

void StateWriter::i64(int64_t v) {
  out_ += std::to_string(v) + ' ';
}

void StateWriter::f64(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a ", v);  // hex float: exact round trip, nan/inf included
  out_ += buf;
}

void StateWriter::str(const std::string& s) {
  out_ += std::to_string(s.size()) + ':' + s + ' ';
}

void StateWriter::i64s(const std::vector<int64_t>& v) {
  i64(static_cast<int64_t>(v.size()));
  for (int64_t x : v) i64(x);
}

void StateWriter::f64s(const std::vector<double>& v) {
  i64(static_cast<int64_t>(v.size()));
  for (double x : v) f64(x);
}

bool state_has_tag(const std::string& state, const std::string& tag) {
  const std::string header = header_of(tag);
  return state.compare(0, header.size(), header) == 0;
}

StateReader::StateReader(const std::string& state, const std::string& tag) : in_(state) {
  if (!state_has_tag(state, tag)) throw std::invalid_argument("balancer state is not a '" + tag + "' state");
  pos_ = header_of(tag).size();
}

std::string StateReader::token() {
  const size_t end = in_.find(' ', pos_);
  if (end == std::string::npos) throw std::invalid_argument("balancer state is truncated");
  std::string t = in_.substr(pos_, end - pos_);
  pos_ = end + 1;
  return t;
}

int64_t StateReader::i64() {
  const std::string t = token();
  char* end = nullptr;
  const long long v = std::strtoll(t.c_str(), &end, 10);
  if (t.empty() || *end != '\0') throw std::invalid_argument("balancer state: bad integer '" + t + "'");
  return v;
}

double StateReader::f64() {
  const std::string t = token();
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (t.empty() || *end != '\0') throw std::invalid_argument("balancer state: bad number '" + t + "'");
  return v;
}

std::string StateReader::str() {
  const size_t colon = in_.find(':', pos_);
  if (colon == std::string::npos) throw std::invalid_argument("balancer state is truncated");
  const size_t len = std::stoull(in_.substr(pos_, colon - pos_));
  if (colon + 1 + len + 1 > in_.size()) throw std::invalid_argument("balancer state is truncated");
  std::string s = in_.substr(colon + 1, len);
  pos_ = colon + 1 + len + 1;
  return s;
}

std::vector<int64_t> StateReader::i64s() {
  const int64_t n = i64();
  if (n < 0 || static_cast<size_t>(n) > in_.size())
    throw std::invalid_argument("balancer state: bad vector length");
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = i64();
  return v;
}

std::vector<double> StateReader::f64s() {
  const int64_t n = i64();
  if (n < 0 || static_cast<size_t>(n) > in_.size())
    throw std::invalid_argument("balancer state: bad vector length");
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = f64();
  return v;
}

}  // namespace lbbsp::balancer
