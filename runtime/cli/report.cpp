// `lbbsp report RUN_DIR...`: the runs' telemetry as a markdown (or JSON) report on stdout; --png / --html DIR
// add figures drawn by scripts/report_figures.py (matplotlib). Pure reading: MPI is never initialised.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/analysis/report.hpp"
#include "runtime/cli/commands.hpp"

#ifndef LBBSP_SOURCE_DIR
#define LBBSP_SOURCE_DIR ""
#endif

namespace lbbsp::cli {
namespace fs = std::filesystem;
namespace {

struct ReportOptions {
  std::vector<std::string> runs;
  std::string format = "md";
  std::string png_dir, html_dir;
  size_t max_episodes = 15;
  runtime::report::Options analysis;
};

// scripts/report_figures.py: in $LBBSP_SCRIPTS_DIR when set, else beside the binary (build/lbbsp ->
// scripts/), else in the source tree this binary was built from.
std::string find_figure_script() {
  std::vector<fs::path> tried;
  const char* env = std::getenv("LBBSP_SCRIPTS_DIR");
  if (env) tried.push_back(fs::path(env) / "report_figures.py");
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!env && !ec) {
    tried.push_back(self.parent_path().parent_path() / "scripts/report_figures.py");
    tried.push_back(self.parent_path() / "scripts/report_figures.py");
  }
  if (!env && *LBBSP_SOURCE_DIR) tried.push_back(fs::path(LBBSP_SOURCE_DIR) / "scripts/report_figures.py");
  std::string list;
  for (const auto& p : tried) {
    if (fs::is_regular_file(p)) return p.string();
    list += (list.empty() ? "" : ", ") + p.string();
  }
  throw std::runtime_error("figures need scripts/report_figures.py, not found (looked at " + list +
                           "); set LBBSP_SCRIPTS_DIR to the folder holding it");
}

// Debian's python3 has matplotlib and h5py (scripts/setup.sh); $LBBSP_PYTHON overrides.
std::string python() {
  if (const char* env = std::getenv("LBBSP_PYTHON")) return env;
  return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

int run_figures(const ReportOptions& o, const std::string& markdown) {
  const std::string script = find_figure_script();
  std::vector<std::string> args = {python(), script};
  for (const auto& [flag, dir] : {std::pair{"--png", o.png_dir}, std::pair{"--html", o.html_dir}}) {
    if (dir.empty()) continue;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw std::runtime_error(std::string(flag) + ": cannot create '" + dir + "': " + ec.message());
    args.push_back(flag);
    args.push_back(dir);
    if (std::string(flag) == "--html") {
      const std::string md = (fs::path(dir) / "report.md").string();
      std::ofstream(md) << markdown;
      args.push_back("--markdown");
      args.push_back(md);
    }
  }
  for (const auto& r : o.runs) args.push_back(r);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("cannot start " + args[0]);
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "lbbsp: error: cannot run '%s' for the figures (set LBBSP_PYTHON)\n", argv[0]);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  std::fprintf(stderr, "lbbsp: error: %s failed; the figures are incomplete\n", script.c_str());
  return 1;
}

}  // namespace

void add_report_command(CLI::App& app) {
  static ReportOptions o;
  auto* r = app.add_subcommand(
      "report",
      "Where the time went in finished runs: per-rank wait, straggler episodes, predictor error, "
      "savings of balancing; several runs side by side (reads --log-dir folders, no MPI)");
  r->add_option("RUN_DIR", o.runs, "--log-dir folders of lbbsp train (telemetry.h5, summary.json if present)")
      ->required();
  r->add_option("--format", o.format, "md | json, on stdout")
      ->check(CLI::IsMember({"md", "json"}))
      ->capture_default_str();
  r->add_option("--png", o.png_dir, "Write the figures (PNG) into this folder");
  r->add_option("--html", o.html_dir, "Write report.html with the tables and figures into this folder");
  r->add_option("--slow-below", o.analysis.slow_below,
                "A rank straggles when its speed is below this fraction of the other ranks' median")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  r->add_option("--min-episode", o.analysis.min_episode, "Shortest straggler episode, in iterations")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  r->add_option("--episode-gap", o.analysis.episode_gap,
                "Normal iterations an episode may contain without ending")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  r->add_option("--max-episodes", o.max_episodes, "Episodes listed per run (the longest)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  r->footer(
      "docs/report.md explains each number. Exit status 1 when a folder has no readable telemetry or "
      "the runs have different rank counts.");
  r->callback([] {
    std::vector<runtime::report::RunData> data;
    for (const auto& dir : o.runs) data.push_back(runtime::report::load_run(dir));
    runtime::report::check_comparable(data);
    std::vector<runtime::report::RunReport> reports;
    for (const auto& d : data) reports.push_back(runtime::report::analyse(d, o.analysis));
    runtime::report::disambiguate_names(reports);
    const std::string markdown = runtime::report::to_markdown(reports, o.max_episodes);
    if (o.format == "json")
      std::cout << runtime::report::to_json(reports).dump(2) << '\n';
    else
      std::cout << markdown;
    std::cout.flush();
    if (!o.png_dir.empty() || !o.html_dir.empty())
      if (int rc = run_figures(o, markdown); rc != 0) std::exit(rc);
  });
}

}  // namespace lbbsp::cli
