// Subcommands of the `lbbsp` command; each lives in its own file in runtime/cli/ and registers itself on the
// app.
#pragma once
#include <CLI/CLI.hpp>

namespace lbbsp::cli {

void add_train_command(CLI::App& app);         // cli/train.cpp
void add_data_command(CLI::App& app);          // cli/data.cpp
void add_info_command(CLI::App& app);          // cli/info.cpp
void add_predict_eval_command(CLI::App& app);  // cli/predict_eval.cpp
void add_simulate_command(CLI::App& app);      // cli/simulate.cpp
void add_report_command(CLI::App& app);        // cli/report.cpp

// `lbbsp CMD --config FILE` fills CMD's options from the file's [CMD] section (the --config option lives on
// the main app, main.cpp, and the subcommand falls through to it); a key that is not one of CMD's flags is an
// error.
inline void read_config_section(CLI::App* cmd) {
  cmd->fallthrough();
  cmd->allow_config_extras(CLI::config_extras_mode::error);
}

}  // namespace lbbsp::cli
