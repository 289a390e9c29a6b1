// libFuzzer target: parsing of `lbbsp train` flags (the CLI11 app built by add_train_command). The input is
// split into arguments at newlines; only parsing and the flag checks run: the subcommand's callback
// (training) is replaced, and run_training/Comm are stubs that trap if ever reached.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/cli/commands.hpp"
#include "runtime/platform/comm.hpp"
#include "runtime/train/trainer.hpp"

namespace lbbsp::runtime {
// Stubs: runtime/cli/train.cpp's callback references these; the fuzzer never runs it.
struct Comm::Handles {};  // comm.cpp's holds MPI handles; not linked here
Comm::Comm(int*, char***) {
  __builtin_trap();
}
Comm::~Comm() {}
void Comm::abort(const std::string&, int) const {
  __builtin_trap();
}
int run_training(const TrainConfig&, Comm&) {
  __builtin_trap();
}
}  // namespace lbbsp::runtime

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 2048) return 0;
  std::vector<std::string> args{"lbbsp"};
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  args.push_back(cur);
  CLI::App app("lbbsp");
  lbbsp::cli::add_train_command(app);
  app.get_subcommand("train")->callback([] {});
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  } catch (const CLI::Error&) {
  }
  return 0;
}
