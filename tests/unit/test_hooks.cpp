// Hooks: the trainer's hooks run in the order added except where one names hooks it must follow, each is
// timed, and a cycle or a late add is a programming error that says so.
#include "runtime/train/hooks.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace lbbsp::runtime {
namespace {

class Recorder : public TrainHook {
 public:
  Recorder(const char* name, std::vector<std::string>* log) : name_(name), log_(log) {}
  const char* name() const override { return name_; }
  void on_iteration_end(const IterationContext&) override { log_->push_back(name_); }
  void on_train_end(const TrainEndContext& c) override {
    log_->push_back(name_);
    last_seen_ = c.hook_seconds;
  }
  std::vector<std::pair<std::string, double>> last_seen_;

 private:
  const char* name_;
  std::vector<std::string>* log_;
};

TEST(Hooks, RunInTheOrderAddedUnlessAHookNamesTheOnesItFollows) {
  std::vector<std::string> log;
  Hooks hooks;
  hooks.add(std::make_unique<Recorder>("summary", &log), {"telemetry", "evaluation"});
  hooks.add(std::make_unique<Recorder>("progress", &log));
  hooks.add(nullptr);  // a hook this run does not have
  hooks.add(std::make_unique<Recorder>("evaluation", &log), {"not added"});
  hooks.add(std::make_unique<Recorder>("telemetry", &log));
  hooks.on_iteration_end({});
  EXPECT_EQ(log, (std::vector<std::string>{"progress", "evaluation", "telemetry", "summary"}));
  EXPECT_EQ(hooks.names(), (std::vector<std::string>{"progress", "evaluation", "telemetry", "summary"}));
  EXPECT_THROW(hooks.add(std::make_unique<Recorder>("late", &log)), std::logic_error);
}

TEST(Hooks, EachHookSeesTheTimesOfTheHooksBeforeItAtTheEnd) {
  std::vector<std::string> log;
  Hooks hooks;
  auto first = std::make_unique<Recorder>("first", &log);
  auto last = std::make_unique<Recorder>("last", &log);
  Recorder* last_seen = last.get();
  hooks.add(std::move(first));
  hooks.add(std::move(last));
  hooks.on_train_end({});
  ASSERT_EQ(last_seen->last_seen_.size(), 2u);
  EXPECT_EQ(last_seen->last_seen_[0].first, "first");
  EXPECT_GT(last_seen->last_seen_[0].second, 0.0);  // its call was timed
  EXPECT_EQ(last_seen->last_seen_[1].second, 0.0);  // "last" had not run yet
}

TEST(Hooks, ACycleIsNamed) {
  std::vector<std::string> log;
  Hooks hooks;
  hooks.add(std::make_unique<Recorder>("a", &log), {"b"});
  hooks.add(std::make_unique<Recorder>("b", &log), {"a"});
  try {
    hooks.on_iteration_end({});
    FAIL() << "no error for a cycle";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("'a' waits on a cycle"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lbbsp::runtime
