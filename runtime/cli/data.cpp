// `lbbsp data import-fashion-mnist`, `lbbsp data synth` and `lbbsp data export-traces`.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include "runtime/analysis/traces.hpp"
#include "runtime/cli/checks.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/io/dataset.hpp"

namespace lbbsp::cli {

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare datasets (HDF5); export trace series (CSV)");
  data->require_subcommand(1);

  auto* imp = data->add_subcommand("import-fashion-mnist", "Convert Fashion-MNIST IDX files to HDF5");
  static std::string src = "/usr/share/datasets/fashion-mnist", out;
  imp->add_option("--src", src, "Folder with the IDX files (gzip or plain)")->capture_default_str();
  imp->add_option("--out", out, "HDF5 file to write")->required();
  imp->callback([] {
    auto [train, test] = runtime::import_fashion_mnist(src, out);
    std::printf("wrote %s: %lld train and %lld test samples\n", out.c_str(), static_cast<long long>(train),
                static_cast<long long>(test));
  });

  auto* syn = data->add_subcommand("synth", "Write a synthetic, learnable classification set");
  static int64_t samples = 0, test_samples = -1;
  static int features = 0, classes = 10;
  static uint64_t seed = 1;
  static std::string sout;
  syn->add_option("--samples", samples, "Training samples")->required()->check(kPositive);
  syn->add_option("--test-samples", test_samples, "Test samples (default: samples/6)");
  syn->add_option("--features", features, "Features per sample (a perfect square is stored as an image)")
      ->required()
      ->check(kPositive);
  syn->add_option("--classes", classes, "Classes")->check(CLI::Range(2, 256))->capture_default_str();
  syn->add_option("--seed", seed, "Seed")->capture_default_str();
  syn->add_option("--out", sout, "HDF5 file to write")->required();
  syn->callback([] {
    runtime::write_synthetic(samples, features, classes, seed, sout, test_samples);
    std::printf("wrote %s: %lld samples, %d features, %d classes\n", sout.c_str(),
                static_cast<long long>(samples), features, classes);
  });

  // For scripts that analyse traces (dev/experiment.py --trace-ceiling): one reader, this one.
  auto* exp = data->add_subcommand(
      "export-traces", "Write the capacity series of trace files as CSV: series,family,time_s,capacity");
  static std::string traces, eout = "-";
  exp->add_option("--traces", traces, "Trace file or directory (any format `--straggle trace:` reads)")
      ->required();
  exp->add_option("--out", eout,
                  "CSV file to write ('-': standard output); time_s is in the trace's own clock")
      ->capture_default_str();
  exp->callback([] {
    const auto series = runtime::load_traces(traces);
    std::ofstream file;
    if (eout != "-") {
      file.open(eout);
      if (!file) throw std::runtime_error("cannot write '" + eout + "' (--out): check the folder exists");
    }
    std::ostream& os = eout == "-" ? std::cout : file;
    os.precision(17);
    os << "series,family,time_s,capacity\n";
    for (const auto& s : series) {
      // Quoted: a source is a path, which may hold commas.
      std::string name = "\"";
      for (char c : s.source) name += c == '"' ? std::string("\"\"") : std::string(1, c);
      name += '"';
      for (size_t i = 0; i < s.capacity.size(); ++i)
        os << name << ',' << s.family << ',' << s.origin_s + s.time_s[i] << ',' << s.capacity[i] << '\n';
    }
    if (!os.flush()) throw std::runtime_error("writing '" + eout + "' (--out) failed: disk full?");
  });
}

}  // namespace lbbsp::cli
