#include "runtime/straggle/emulation.hpp"

namespace lbbsp::runtime::straggle {

namespace {
class NoEmulation final : public Emulation {};
}  // namespace

const std::string& Emulation::source_of(int /*rank*/) const {
  static const std::string none;
  return none;
}

std::unique_ptr<Emulation> make_emulation(const Config& config) {
  switch (config.kind) {
    case Kind::kStatic:
      return make_static(config);
    case Kind::kTrace:
      return make_trace_replay(config);
    case Kind::kStress:
      return make_cotenant(config);
    case Kind::kNone:
      break;
  }
  return std::make_unique<NoEmulation>();
}

}  // namespace lbbsp::runtime::straggle
