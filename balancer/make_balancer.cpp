// make_balancer(): checks the config, parses the balancer spec (KIND[:ARGS], common/spec.hpp) and builds the
// balancer of that kind (one per file: bsp.cpp, static.cpp, random.cpp, lbbsp_cpu.cpp, lbbsp_gpu.cpp,
// lbbsp_gpu_model.cpp, oracle.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "balancer/balancer.hpp"
#include "balancer/balancer_base.hpp"
#include "common/spec.hpp"

namespace lbbsp::balancer {
namespace {

constexpr const char* kValidBalancers =
    "valid: bsp, static[:K], random[:SEED], lbbsp-cpu[:PREDICTOR][;band=F][;track=F][;follow=0|1], "
    "lbbsp-gpu[:W], lbbsp-gpu-model, oracle";

// Whole text as a (signed) integer, as std::stoll reads it; `what` names the field in the message.
int64_t parse_int(const spec::Spec& spec, const std::string& text, const std::string& what) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size()) spec.fail("bad " + what + " '" + text + "'");
  return v;
}

// lbbsp-cpu's ;band=FACTOR and ;track=FACTOR (detail::BandFactors), each finite and >= 0, and ;follow=0|1.
detail::BandFactors band_factors(const spec::Spec& spec) {
  detail::BandFactors factors;
  for (const auto& kv : spec.options()) {
    if (kv.key == "follow") {
      if (kv.value != "0" && kv.value != "1")
        spec.fail(
            "follow must be 0 or 1 (1: follow a confirmed change of phase; 0, the default: not), got '" +
            kv.value + "'");
      factors.follow = kv.value == "1";
      continue;
    }
    if (kv.key != "band" && kv.key != "track")
      spec.fail("lbbsp-cpu takes the options band=FACTOR, track=FACTOR and follow=0|1, got '" + kv.key + "'");
    double factor = 0;
    if (!spec::parse_number(kv.value, factor) || !std::isfinite(factor) || factor < 0)
      spec.fail(kv.key +
                " must be a number >= 0 (the noise band's width in RMS misses; band=0.5 and track=1 by "
                "default), got '" +
                kv.value + "'");
    (kv.key == "band" ? factors.band : factors.track) = factor;
  }
  return factors;
}

void check_config(const BalancerConfig& cfg) {
  if (cfg.workers < 1)
    throw std::invalid_argument("balancer: workers must be >= 1, got " + std::to_string(cfg.workers));
  if (cfg.global_batch < 0) throw std::invalid_argument("balancer: global batch must be >= 0");
  if (cfg.min_batch < 0) throw std::invalid_argument("balancer: min batch must be >= 0");
  if (cfg.min_batch > 0 && cfg.min_batch > cfg.global_batch / cfg.workers)
    throw std::invalid_argument("balancer: min batch " + std::to_string(cfg.min_batch) + " x " +
                                std::to_string(cfg.workers) + " workers exceeds the global batch " +
                                std::to_string(cfg.global_batch));
  if (cfg.num_exo < 0) throw std::invalid_argument("balancer: num_exo must be >= 0");
  if (cfg.capacity_exo >= cfg.num_exo || cfg.capacity_exo < -1)
    throw std::invalid_argument("balancer: capacity_exo " + std::to_string(cfg.capacity_exo) +
                                " is not an exo index (num_exo " + std::to_string(cfg.num_exo) + ")");
  if (!cfg.mem_cap.empty() && cfg.mem_cap.size() != static_cast<size_t>(cfg.workers))
    throw std::invalid_argument("balancer: " + std::to_string(cfg.mem_cap.size()) + " memory caps for " +
                                std::to_string(cfg.workers) + " workers");
}

std::map<std::string, BalancerFactory>& registered() {
  static std::map<std::string, BalancerFactory> kinds;
  return kinds;
}

std::string valid_balancers() {
  std::string valid = kValidBalancers;
  for (const auto& [kind, factory] : registered()) valid += ", " + kind + "[:ARGS]";
  return valid;
}

}  // namespace

void register_balancer(const std::string& kind, BalancerFactory factory) {
  const auto& kinds = balancer_kinds();
  if (kind.empty() || kind.find_first_of(":;") != std::string::npos)
    throw std::invalid_argument("register_balancer: a kind is a name without ':' or ';', got '" + kind + "'");
  if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end() || registered().count(kind))
    throw std::invalid_argument("register_balancer: the balancer kind '" + kind + "' exists already");
  if (!factory) throw std::invalid_argument("register_balancer: the kind '" + kind + "' needs a factory");
  registered()[kind] = std::move(factory);
}

const std::vector<std::string>& balancer_kinds() {
  static const std::vector<std::string> kinds = {"bsp",       "static",          "random", "lbbsp-cpu",
                                                 "lbbsp-gpu", "lbbsp-gpu-model", "oracle"};
  return kinds;
}

std::unique_ptr<Balancer> make_balancer(const BalancerConfig& cfg) {
  check_config(cfg);
  const std::string valid = valid_balancers();
  const spec::Spec spec(cfg.name, "balancer", valid);
  const std::string& kind = spec.kind();
  const auto& kinds = balancer_kinds();
  if (const auto own = registered().find(kind); own != registered().end()) {
    spec.expect_no_options();
    auto made = own->second(cfg, spec.has_args() ? spec.args() : "");
    if (!made) spec.fail("the factory registered for '" + kind + "' returned no balancer");
    return made;
  }
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end())
    spec.fail("unknown balancer '" + cfg.name + "'");
  if (kind != "lbbsp-cpu") spec.expect_no_options();
  if (kind == "bsp") return spec.expect_no_args(), detail::make_bsp(cfg);
  if (kind == "oracle") return spec.expect_no_args(), detail::make_oracle(cfg);
  if (kind == "lbbsp-gpu-model") return spec.expect_no_args(), detail::make_lbbsp_gpu_model(cfg);
  if (kind == "static") {
    const int64_t k = spec.has_args() ? parse_int(spec, spec.args(), "static measuring iterations") : 5;
    if (k < 1) spec.fail("static needs >= 1 measuring iteration, got " + spec.args());
    return detail::make_static(cfg, k);
  }
  if (kind == "random") {
    const int64_t seed =
        spec.has_args() ? parse_int(spec, spec.args(), "random seed") : static_cast<int64_t>(cfg.seed);
    return detail::make_random(cfg, static_cast<uint64_t>(seed));
  }
  if (kind == "lbbsp-cpu") {  // the arguments are a predictor spec, parsed by make_predictor()
    const std::string predictor = spec.has_args() ? spec.args() : cfg.predictor;
    if (predictor.empty()) spec.fail("lbbsp-cpu needs a predictor spec");
    return detail::make_lbbsp_cpu(cfg, predictor, band_factors(spec));
  }
  const int64_t window = spec.has_args() ? parse_int(spec, spec.args(), "lbbsp-gpu window") : 2;
  if (window < 1) spec.fail("lbbsp-gpu window must be >= 1, got " + spec.args());
  return detail::make_lbbsp_gpu(cfg, window);  // kind == "lbbsp-gpu"
}

}  // namespace lbbsp::balancer
