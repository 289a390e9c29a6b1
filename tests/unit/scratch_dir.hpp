// A test process's scratch folder under the system's temporary directory: one per process
// (gtest_discover_tests runs each test in its own), emptied when made and removed when the process ends, so a
// run leaves nothing behind.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace lbbsp::testing {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix)
      : path_(std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;  // a destructor must not throw; a folder left behind is harmless
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // PREFIX<pid>/name; the folder exists for as long as the process.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace lbbsp::testing
