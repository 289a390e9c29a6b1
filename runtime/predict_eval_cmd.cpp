// Placeholder until the predict_eval subcommand lands; replaced by its owner.
#include <stdexcept>

#include "runtime/commands.hpp"

namespace lbbsp::cli {
void add_predict_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("predict-eval", "(not available yet)");
  cmd->callback([] { throw std::runtime_error("this subcommand is not built yet"); });
}
}  // namespace lbbsp::cli
