// The `lbbsp` command: one binary, subcommands registered from runtime/cli/*.cpp.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "runtime/cli/commands.hpp"
#include "runtime/platform/comm.hpp"
#include "runtime/platform/kernel_env.hpp"

namespace {

// CLI11's words for a bad --config file, reworded to name the fix; "" when the error is not about --config
// (only --config reads a file while parsing).
std::string config_problem(const CLI::ParseError& e) {
  std::string what = e.what();
  if (dynamic_cast<const CLI::ConfigError*>(&e)) {
    const std::string unknown = "INI was not able to parse ";
    if (what.rfind(unknown, 0) != 0) return what;
    return "unknown key '" + what.substr(unknown.size()) +
           "' (keys are the long flag names without dashes, in the subcommand's section: [train] then "
           "global-batch = 512; see `lbbsp train --help`)";
  }
  if (dynamic_cast<const CLI::FileError*>(&e)) {
    const std::string unreadable = " was not readable (missing?)";
    if (what.ends_with(unreadable))
      what = "cannot read '" + what.substr(0, what.size() - unreadable.size()) + "'";
    return what + ": give an existing TOML file";
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  // libgomp reads its settings when it loads: bound how long idle OpenMP threads spin and run again once
  // (docs/threads.md).
  lbbsp::runtime::reexec_with_kernel_environment(argv);
  CLI::App app{
      "lbbsp: straggler-free synchronous data-parallel training (LB-BSP semi-dynamic load balancing)"};
  app.set_version_flag("--version", std::string("lbbsp ") + LBBSP_VERSION);
  app.require_subcommand(1);
  app.set_config("--config", "",
                 "Read flags from a TOML file, one section per subcommand ([train] global-batch = 512); "
                 "flags on the command line win. `lbbsp train --log-dir DIR` writes DIR/config.toml");
  app.allow_config_extras(CLI::config_extras_mode::error);  // a misspelt key must not be ignored silently
  lbbsp::cli::add_train_command(app);
  lbbsp::cli::add_data_command(app);
  lbbsp::cli::add_info_command(app);
  lbbsp::cli::add_predict_eval_command(app);
  lbbsp::cli::add_simulate_command(app);
  lbbsp::cli::add_report_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Under mpirun every rank parses the same flags: only the first one reports a bad flag.
    if (lbbsp::runtime::launcher_rank() != 0) return e.get_exit_code();
    if (auto problem = config_problem(e); !problem.empty()) {
      std::fprintf(stderr, "lbbsp: error: --config: %s\n", problem.c_str());
      return 2;
    }
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lbbsp: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
