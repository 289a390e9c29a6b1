// `lbbsp data import-fashion-mnist` and `lbbsp data synth`.
#include <cstdio>

#include "runtime/commands.hpp"
#include "runtime/dataset.hpp"

namespace lbbsp::cli {

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare datasets (HDF5)");
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
  syn->add_option("--samples", samples, "Training samples")->required()->check(CLI::PositiveNumber);
  syn->add_option("--test-samples", test_samples, "Test samples (default: samples/6)");
  syn->add_option("--features", features, "Features per sample (a perfect square is stored as an image)")
      ->required()
      ->check(CLI::PositiveNumber);
  syn->add_option("--classes", classes, "Classes")->check(CLI::Range(2, 256))->capture_default_str();
  syn->add_option("--seed", seed, "Seed")->capture_default_str();
  syn->add_option("--out", sout, "HDF5 file to write")->required();
  syn->callback([] {
    runtime::write_synthetic(samples, features, classes, seed, sout, test_samples);
    std::printf("wrote %s: %lld samples, %d features, %d classes\n", sout.c_str(),
                static_cast<long long>(samples), features, classes);
  });
}

}  // namespace lbbsp::cli
