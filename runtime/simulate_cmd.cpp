// Placeholder until the simulate subcommand lands; replaced by its owner.
#include <stdexcept>

#include "runtime/commands.hpp"

namespace lbbsp::cli {
void add_simulate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("simulate", "(not available yet)");
  cmd->callback([] { throw std::runtime_error("this subcommand is not built yet"); });
}
}  // namespace lbbsp::cli
