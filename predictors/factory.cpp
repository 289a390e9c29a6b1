// make_predictor: parses "last", "ema[:ALPHA]", "arima[:P,D,Q[,window=N]]", "narx[:key=value,...]", "oracle"
// with the shared spec parser (common/spec.hpp).
#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/spec.hpp"
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

// Whole text as a number of type T (spec::parse_number: no '+', no spaces); `key` names the field.
template <class T>
T parse_value(const spec::Spec& spec, const std::string& key, const std::string& text) {
  T value{};
  if (!spec::parse_number(text, value)) spec.fail("'" + key + "' needs a number, got '" + text + "'");
  return value;
}

// ema[:ALPHA]
std::unique_ptr<Predictor> make_ema(const spec::Spec& spec) {
  const double alpha = spec.has_args() ? parse_value<double>(spec, "alpha", spec.args()) : 0.3;
  if (!(alpha > 0 && alpha <= 1)) spec.fail("alpha must be in (0, 1]");
  return std::make_unique<EmaPredictor>(alpha);
}

// arima[:P,D,Q[,window=N]]
std::unique_ptr<Predictor> make_arima(const spec::Spec& spec) {
  ArimaOptions o;
  if (!spec.has_args()) return std::make_unique<ArimaPredictor>(o);
  const std::vector<std::string> parts = spec.args_list(',');
  if (parts.size() < 3) spec.fail("arima needs P,D,Q");
  o.p = parse_value<int>(spec, "P", parts[0]);
  o.d = parse_value<int>(spec, "D", parts[1]);
  o.q = parse_value<int>(spec, "Q", parts[2]);
  for (size_t i = 3; i < parts.size(); ++i) {
    const std::vector<std::string> kv = spec::split(parts[i], '=');
    if (kv.size() != 2 || kv[0] != "window") spec.fail("unknown arima option '" + parts[i] + "'");
    o.window = parse_value<int>(spec, "window", kv[1]);
  }
  return std::make_unique<ArimaPredictor>(o);
}

// narx[:key=value,...] with the keys of kNarxInts and kNarxDoubles.
std::unique_ptr<Predictor> make_narx(const spec::Spec& spec, int num_exo, uint64_t seed) {
  NarxOptions o;
  for (const std::string& part : spec.args_list(',')) {
    const std::vector<std::string> kv = spec::split(part, '=');
    if (kv.size() != 2) spec.fail("narx options are key=value, got '" + part + "'");
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
    if (!known) spec.fail("unknown narx option '" + key + "'");
  }
  return std::make_unique<NarxPredictor>(o, num_exo, seed);
}

std::unique_ptr<Predictor> make_kind(const spec::Spec& spec, int num_exo, uint64_t seed) {
  const std::string& kind = spec.kind();
  const auto& kinds = predictor_kinds();
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end())
    spec.fail("unknown predictor '" + kind + "'");
  spec.expect_no_options();  // no predictor takes ;KEY=VALUE options
  if (kind == "last") return spec.expect_no_args(), std::make_unique<LastPredictor>();
  if (kind == "oracle") return spec.expect_no_args(), std::make_unique<OraclePredictor>();
  if (kind == "ema") return make_ema(spec);
  if (kind == "arima") return make_arima(spec);
  return make_narx(spec, num_exo, seed);
}

}  // namespace

const std::vector<std::string>& predictor_kinds() {
  static const std::vector<std::string> kinds = {"last", "ema", "arima", "narx", "oracle"};
  return kinds;
}

std::unique_ptr<Predictor> make_predictor(const std::string& text, int num_exo, uint64_t seed) {
  const spec::Spec spec(text, "predictor", valid_specs());
  if (num_exo < 0) spec.fail("num_exo must be >= 0");
  try {
    return make_kind(spec, num_exo, seed);
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    if (what.rfind("predictor: ", 0) == 0) throw;  // already in the spec's style
    spec.fail(what);  // a predictor's own check, e.g. "narx dy must be in [1, 64]"
  }
}

}  // namespace lbbsp::predictors
