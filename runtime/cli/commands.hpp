// Subcommands of the `lbbsp` command; each lives in its own *_cmd.cpp and registers itself on the app.
#pragma once
#include <CLI/CLI.hpp>

namespace lbbsp::cli {

void add_train_command(CLI::App& app);         // train_cmd.cpp
void add_data_command(CLI::App& app);          // data_cmd.cpp
void add_info_command(CLI::App& app);          // info_cmd.cpp
void add_predict_eval_command(CLI::App& app);  // predict_eval_cmd.cpp
void add_simulate_command(CLI::App& app);      // simulate_cmd.cpp
void add_report_command(CLI::App& app);        // report_cmd.cpp

// `lbbsp CMD --config FILE` fills CMD's options from the file's [CMD] section (the --config option lives on
// the main app, main.cpp, and the subcommand falls through to it); a key that is not one of CMD's flags is an
// error.
inline void read_config_section(CLI::App* cmd) {
  cmd->fallthrough();
  cmd->allow_config_extras(CLI::config_extras_mode::error);
}

}  // namespace lbbsp::cli
