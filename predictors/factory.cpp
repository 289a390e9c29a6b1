// make_predictor: parses "last", "ema[:ALPHA]", "arima[:P,D,Q[,window=N]]", "narx[:key=value,...]", "oracle".
#include <charconv>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "predictors/arima.hpp"
#include "predictors/basic.hpp"
#include "predictors/narx.hpp"
#include "predictors/predictor.hpp"

namespace lbbsp::predictors {
namespace {

// narx's key=value options; the error message lists them with the defaults of NarxOptions.
template <class T>
struct NarxField {
  const char* key;
  T NarxOptions::*field;
};
constexpr NarxField<int> kNarxInts[] = {{"dy", &NarxOptions::dy},         {"du", &NarxOptions::du},
                                        {"hidden", &NarxOptions::hidden}, {"window", &NarxOptions::window},
                                        {"epochs", &NarxOptions::epochs}, {"batch", &NarxOptions::batch},
                                        {"ratio", &NarxOptions::ratio}};
constexpr NarxField<double> kNarxDoubles[] = {{"lr", &NarxOptions::lr},
                                              {"sharp", &NarxOptions::sharp},
                                              {"forget", &NarxOptions::forget},
                                              {"ridge", &NarxOptions::ridge}};

std::string valid_specs() {
  const NarxOptions defaults;
  std::ostringstream narx;
  const char* sep = "";
  for (const auto& f : kNarxInts) narx << std::exchange(sep, ",") << f.key << '=' << defaults.*f.field;
  for (const auto& f : kNarxDoubles) narx << std::exchange(sep, ",") << f.key << '=' << defaults.*f.field;
  return "valid: last, ema[:ALPHA] (e.g. ema:0.3), arima[:P,D,Q[,window=N]] (e.g. arima:1,0,1), narx[:" +
         narx.str() + "], oracle";
}

[[noreturn]] void bad_spec(const std::string& spec, const std::string& why) {
  throw std::invalid_argument("bad predictor spec '" + spec + "': " + why + " (" + valid_specs() + ")");
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t end = s.find(sep, start);
    out.emplace_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

template <class T>
T parse_value(const std::string& spec, const std::string& key, const std::string& text) {
  T value{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
    bad_spec(spec, "'" + key + "' needs a number, got '" + text + "'");
  return value;
}

}  // namespace

std::unique_ptr<Predictor> make_predictor(const std::string& spec, int num_exo, uint64_t seed) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const bool has_args = colon != std::string::npos;
  const std::string args = has_args ? spec.substr(colon + 1) : "";
  if (num_exo < 0) bad_spec(spec, "num_exo must be >= 0");
  try {
    if (kind == "last" || kind == "oracle") {
      if (has_args) bad_spec(spec, "'" + kind + "' takes no arguments");
      if (kind == "last") return std::make_unique<LastPredictor>();
      return std::make_unique<OraclePredictor>();
    }
    if (kind == "ema") {
      const double alpha = has_args ? parse_value<double>(spec, "alpha", args) : 0.3;
      if (!(alpha > 0 && alpha <= 1)) bad_spec(spec, "alpha must be in (0, 1]");
      return std::make_unique<EmaPredictor>(alpha);
    }
    if (kind == "arima") {
      ArimaOptions o;
      if (has_args) {
        auto parts = split(args, ',');
        if (parts.size() < 3) bad_spec(spec, "arima needs P,D,Q");
        o.p = parse_value<int>(spec, "P", parts[0]);
        o.d = parse_value<int>(spec, "D", parts[1]);
        o.q = parse_value<int>(spec, "Q", parts[2]);
        for (size_t i = 3; i < parts.size(); ++i) {
          auto kv = split(parts[i], '=');
          if (kv.size() != 2 || kv[0] != "window") bad_spec(spec, "unknown arima option '" + parts[i] + "'");
          o.window = parse_value<int>(spec, "window", kv[1]);
        }
      }
      return std::make_unique<ArimaPredictor>(o);
    }
    if (kind == "narx") {
      NarxOptions o;
      if (has_args && !args.empty()) {
        for (const std::string& part : split(args, ',')) {
          auto kv = split(part, '=');
          if (kv.size() != 2) bad_spec(spec, "narx options are key=value, got '" + part + "'");
          const std::string& key = kv[0];
          bool known = false;
          for (const auto& f : kNarxInts) {
            if (key != f.key) continue;
            o.*f.field = parse_value<int>(spec, key, kv[1]);
            known = true;
          }
          for (const auto& f : kNarxDoubles) {
            if (key != f.key) continue;
            o.*f.field = parse_value<double>(spec, key, kv[1]);
            known = true;
          }
          if (!known) bad_spec(spec, "unknown narx option '" + key + "'");
        }
      }
      return std::make_unique<NarxPredictor>(o, num_exo, seed);
    }
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    if (what.rfind("bad predictor spec", 0) == 0) throw;
    bad_spec(spec, what);
  }
  bad_spec(spec, "unknown predictor '" + kind + "'");
}

}  // namespace lbbsp::predictors
