// The `lbbsp` command: one binary, subcommands registered from runtime/*_cmd.cpp.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "runtime/comm.hpp"
#include "runtime/commands.hpp"

int main(int argc, char** argv) {
  // OpenMP threads that spin after each parallel region fight OpenBLAS's own threads for the cores (a 50x
  // slow-down measured at 2 threads). libgomp reads OMP_WAIT_POLICY when it loads, so set it and re-exec
  // once.
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    // Exec the resolved path, not /proc/self/exe, so that the process keeps its name (ps, pgrep, top).
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
      self[n] = '\0';
      execv(self, argv);  // on failure carry on with the spinning default
    }
  }
  CLI::App app{
      "lbbsp: straggler-free synchronous data-parallel training (LB-BSP semi-dynamic load balancing)"};
  app.set_version_flag("--version", std::string("lbbsp ") + LBBSP_VERSION);
  app.require_subcommand(1);
  lbbsp::cli::add_train_command(app);
  lbbsp::cli::add_data_command(app);
  lbbsp::cli::add_info_command(app);
  lbbsp::cli::add_predict_eval_command(app);
  lbbsp::cli::add_simulate_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Under mpirun every rank parses the same flags: only the first one reports a bad flag.
    if (lbbsp::runtime::launcher_rank() != 0) return e.get_exit_code();
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lbbsp: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
