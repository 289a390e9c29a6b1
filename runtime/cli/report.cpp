// `lbbsp report RUN_DIR...`: the runs' telemetry as a markdown (or JSON) report on stdout; --png / --html DIR
// add figures drawn by runtime/cli/report_figures.py (matplotlib). Pure reading: MPI is never initialised.
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

// Set by runtime/CMakeLists.txt for this file: the source and build trees, and the installed script's folder
// relative to the installed binary's.
#ifndef LBBSP_SOURCE_DIR
#define LBBSP_SOURCE_DIR ""
#endif
#ifndef LBBSP_BINARY_DIR
#define LBBSP_BINARY_DIR ""
#endif
#ifndef LBBSP_FIGURES_FROM_BINDIR
#define LBBSP_FIGURES_FROM_BINDIR "../share/lbbsp"
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

// The figures' script, runtime/cli/report_figures.py: $LBBSP_REPORT_FIGURES when set; else, for the binary in
// the build tree it was built in, the source tree's; else where `cmake --install` puts it beside the binary
// (PREFIX/bin/lbbsp -> PREFIX/share/lbbsp/report_figures.py). Never a guess among several places: the error
// names the one path this binary looked at.
std::string find_figure_script() {
  if (const char* env = std::getenv("LBBSP_REPORT_FIGURES")) {
    if (fs::is_regular_file(env)) return env;
    throw std::runtime_error(std::string("figures need report_figures.py, not found at '") + env +
                             "' (named by $LBBSP_REPORT_FIGURES)");
  }
  std::error_code ec;
  const fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec)
    throw std::runtime_error("figures: cannot find this binary's folder (/proc/self/exe: " + ec.message() +
                             ")");
  const bool build_tree = *LBBSP_BINARY_DIR && fs::equivalent(dir, LBBSP_BINARY_DIR, ec);
  const fs::path script = build_tree
                              ? fs::path(LBBSP_SOURCE_DIR) / "runtime/cli/report_figures.py"
                              : (dir / LBBSP_FIGURES_FROM_BINDIR / "report_figures.py").lexically_normal();
  if (fs::is_regular_file(script)) return script.string();
  throw std::runtime_error("figures need report_figures.py, not found at '" + script.string() + "' (" +
                           (build_tree ? "the source tree this build-tree binary was built from"
                                       : "where cmake --install puts it beside this binary") +
                           "); set LBBSP_REPORT_FIGURES to its path");
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
