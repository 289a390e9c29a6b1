#include "runtime/straggle/spec.hpp"

#include <sched.h>

#include <cmath>
#include <cstdlib>

#include "common/spec.hpp"

namespace lbbsp::runtime::straggle {

namespace {

using lbbsp::spec::Spec;

constexpr const char* kWhat = "--straggle";
constexpr const char* kHelp =
    "valid: none | static:F0,F1,... | trace:PATH[,PATH...] | stress:RANK=LOAD[,...], then optional ;scale=S "
    ";rate=K ;align=time ;offset=O,... ;noise=SD ;period=S ;pin=C,... ;gpu=FLOOR:SAT:SLOPE:CAP[,...] ;tick=S "
    ";seed=N";

// An option's comma list; an empty value is an empty list (pin=, offset= and gpu= always meant "none").
std::vector<std::string> list(const std::string& value, char sep = ',') {
  return value.empty() ? std::vector<std::string>{} : spec::split(value, sep);
}

// strtod rather than Spec::number (from_chars): specs that ran before (" 1", "0x10", seed=1e3) still do.
double number(const Spec& s, const std::string& text, const std::string& name) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v))
    s.fail("'" + text + "' is not a number (in " + name + ")");
  return v;
}

int64_t integer(const Spec& s, const std::string& text, const std::string& name) {
  const double v = number(s, text, name);
  if (v != std::floor(v)) s.fail("'" + text + "' is not an integer (in " + name + ")");
  if (std::fabs(v) > 9.0e15)  // beyond 2^53 a double no longer holds every integer (and 1e46 is no int64)
    s.fail("'" + text + "' is out of range (in " + name + ")");
  return static_cast<int64_t>(v);
}

// A number that must be > 0; `why` is the whole message when it is not.
double positive(const Spec& s, const std::string& text, const std::string& name, const std::string& why) {
  const double v = number(s, text, name);
  if (v <= 0) s.fail(why);
  return v;
}

void parse_pin(const Spec& s, const std::string& value, Config& c) {
  for (const auto& text : list(value)) {
    const int64_t cpu = integer(s, text, "pin");
    if (cpu < 0 || cpu >= CPU_SETSIZE)
      s.fail("pin CPU " + text + " must be in 0.." + std::to_string(CPU_SETSIZE - 1));
    c.pin.push_back(static_cast<int>(cpu));
  }
}

void parse_gpu(const Spec& s, const std::string& value, Config& c) {
  for (const auto& profile : list(value)) {
    const auto f = list(profile, ':');
    if (f.size() != 4) s.fail("gpu profile '" + profile + "' must be FLOOR:SAT:SLOPE:CAP");
    const balancer::TimeCurve curve{number(s, f[0], "gpu FLOOR"), number(s, f[1], "gpu SAT"),
                                    number(s, f[2], "gpu SLOPE")};
    const int64_t cap = integer(s, f[3], "gpu CAP");
    if (curve.floor_s < 0 || curve.sat_batch < 0 || curve.slope_s_per_sample < 0 || cap < 1)
      s.fail("gpu profile '" + profile + "' needs FLOOR, SAT, SLOPE >= 0 and CAP >= 1");
    c.gpu_curves.push_back(curve);
    c.gpu_caps.push_back(cap);
  }
}

// One ;KEY=VALUE option, checked for its own range (the kind it belongs to is checked after all of them).
void parse_option(const Spec& s, const spec::KeyValue& kv, Config& c) {
  const std::string& key = kv.key;
  const std::string& val = kv.value;
  if (key == "scale") {
    c.scale_s = positive(s, val, "scale", "scale must be > 0 seconds per trace step");
  } else if (key == "rate") {
    c.rate = positive(s, val, "rate", "rate must be > 0 trace seconds per second");
  } else if (key == "align") {
    if (val != "time" && val != "random") s.fail("align must be 'time' or 'random', not '" + val + "'");
    c.align_time = val == "time";
  } else if (key == "pin") {
    parse_pin(s, val, c);
  } else if (key == "offset") {
    for (const auto& o : list(val)) c.offsets.push_back(integer(s, o, "offset"));
  } else if (key == "noise") {
    c.noise_sd = number(s, val, "noise");
    if (c.noise_sd < 0) s.fail("noise must be >= 0");
  } else if (key == "period") {
    c.period_s = positive(s, val, "period", "period must be > 0 seconds");
  } else if (key == "tick") {
    c.tick_s = positive(s, val, "tick", "tick must be > 0 seconds per iteration");
  } else if (key == "seed") {
    c.seed = static_cast<uint64_t>(integer(s, val, "seed"));  // a negative seed wraps, as it always did
  } else if (key == "gpu") {
    parse_gpu(s, val, c);
  } else {
    s.fail("unknown option '" + key + "'");
  }
}

void parse_static(const Spec& s, Config& c) {
  for (const auto& f : s.args_list()) {
    const double v = number(s, f, "static factors");
    if (v <= 0 || v > 1) s.fail("static factor " + f + " must be in (0, 1]");
    c.static_factors.push_back(v);
  }
  if (c.static_factors.empty()) s.fail("static needs factors, e.g. static:1,1,0.5,0.25");
}

void parse_trace(const Spec& s, Config& c) {
  if (s.args().empty())
    s.fail("trace needs a file or folder, e.g. trace:../shared/traces/planetlab_cloudsim");
  c.trace_paths = s.args_list();
  if (c.align_time && c.rate <= 0) s.fail("align=time needs rate=K (replay by the traces' timestamps)");
  if (c.align_time && !c.offsets.empty()) s.fail("align=time and offset= exclude each other");
}

void parse_stress(const Spec& s, Config& c) {
  c.stress_load.assign(c.ranks, 0);
  for (const auto& item : s.args_list()) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) s.fail("stress entry '" + item + "' must be RANK=LOAD");
    const int64_t r = integer(s, item.substr(0, eq), "stress rank");
    const int64_t load = integer(s, item.substr(eq + 1), "stress load");
    if (r < 0 || r >= c.ranks)
      s.fail("stress rank " + std::to_string(r) + " is not in 0.." + std::to_string(c.ranks - 1));
    if (load < 1 || load > 100) s.fail("stress load must be 1..100 percent");
    c.stress_load[r] = static_cast<int>(load);
  }
}

// Options that only one kind understands.
void check_kind_of_options(const Spec& s, const Config& c) {
  if (!c.pin.empty() && c.kind != Kind::kStress)
    s.fail("pin= is for stress: (replay kinds emulate, they need no pinning)");
  if ((c.rate > 0 || c.align_time) && c.kind != Kind::kTrace) s.fail("rate= and align= are for trace:");
  if (c.tick_s > 0 && c.kind == Kind::kStress)
    s.fail("tick= is for replay (static:, trace:); stress: co-tenants run in wall-clock time");
}

}  // namespace

Config parse(const std::string& text, int ranks, uint64_t seed) {
  const Spec s(text, kWhat, kHelp);
  if (s.kind().empty() && !s.has_args()) s.fail("empty spec");
  Config c;
  c.text = text;
  c.ranks = ranks;
  c.seed = seed;
  for (const auto& kv : s.options()) parse_option(s, kv, c);
  // Arguments of none are ignored, as they always were.
  if (s.kind() == "none") {
    c.kind = Kind::kNone;
  } else if (s.kind() == "static") {
    c.kind = Kind::kStatic;
    parse_static(s, c);
  } else if (s.kind() == "trace") {
    c.kind = Kind::kTrace;
    parse_trace(s, c);
  } else if (s.kind() == "stress") {
    c.kind = Kind::kStress;
    parse_stress(s, c);
  } else {
    s.fail("unknown kind '" + s.kind() + "'");
  }
  check_kind_of_options(s, c);
  return c;
}

void fail(const Config& config, const std::string& why) {
  Spec(config.text, kWhat, kHelp).fail(why);
}

}  // namespace lbbsp::runtime::straggle
