// Subcommands of the `lbbsp` command; each lives in its own *_cmd.cpp and registers itself on the app.
#pragma once
#include <CLI/CLI.hpp>

namespace lbbsp::cli {

void add_train_command(CLI::App& app);         // train_cmd.cpp
void add_data_command(CLI::App& app);          // data_cmd.cpp
void add_info_command(CLI::App& app);          // info_cmd.cpp
void add_predict_eval_command(CLI::App& app);  // predict_eval_cmd.cpp
void add_simulate_command(CLI::App& app);      // simulate_cmd.cpp

}  // namespace lbbsp::cli
