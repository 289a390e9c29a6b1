// Hooks: calls the trainer's hooks in their order, names each to the watchdog and times it.
#include "runtime/train/hooks.hpp"

#include <algorithm>
#include <stdexcept>

#include "runtime/train/watchdog.hpp"

namespace lbbsp::runtime {

void Hooks::add(std::unique_ptr<TrainHook> hook, std::vector<std::string> after) {
  if (!hook) return;
  if (ordered_)
    throw std::logic_error(std::string("Hooks: '") + hook->name() + "' added after the run began");
  entries_.push_back({std::move(hook), std::move(after)});
}

// Repeatedly takes the first hook (in the order added) whose `after` hooks are all placed.
void Hooks::order() {
  if (ordered_) return;
  ordered_ = true;
  auto is_added = [&](const std::string& n) {
    return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return n == e.hook->name(); });
  };
  std::vector<Entry> placed;
  std::vector<std::string> placed_names;
  while (!entries_.empty()) {
    auto ready = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
      return std::all_of(e.after.begin(), e.after.end(), [&](const std::string& n) {
        return !is_added(n) || std::find(placed_names.begin(), placed_names.end(), n) != placed_names.end();
      });
    });
    if (ready == entries_.end())
      throw std::logic_error(std::string("Hooks: '") + entries_.front().hook->name() + "' waits on a cycle");
    placed_names.push_back(ready->hook->name());
    placed.push_back(std::move(*ready));
    entries_.erase(ready);
  }
  entries_ = std::move(placed);
}

template <class Call>
void Hooks::each(const int64_t* beat_iteration, Call&& call) {
  order();
  for (auto& e : entries_) {
    if (watchdog_ && beat_iteration) watchdog_->beat(*beat_iteration, e.hook->name());
    const auto t = std::chrono::steady_clock::now();
    call(*e.hook);
    e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
}

void Hooks::on_train_begin(const TrainContext& c) {
  each(&c.start_iteration, [&](TrainHook& h) { h.on_train_begin(c); });
}

// No beat around the compute: the watchdog keeps naming the compute while it runs.
void Hooks::on_compute_begin(int64_t iteration) {
  each(nullptr, [&](TrainHook& h) { h.on_compute_begin(iteration); });
}

void Hooks::on_compute_end(int64_t iteration, models::StepStats& stats) {
  each(nullptr, [&](TrainHook& h) { h.on_compute_end(iteration, stats); });
}

void Hooks::on_iteration_end(const IterationContext& c) {
  each(&c.iteration, [&](TrainHook& h) { h.on_iteration_end(c); });
}

// Each hook sees the times of the hooks before it and of its own and the later ones' calls before the end.
void Hooks::on_train_end(TrainEndContext c) {
  each(&c.iterations, [&](TrainHook& h) {
    c.hook_seconds = seconds();
    h.on_train_end(c);
  });
}

std::vector<std::pair<std::string, double>> Hooks::seconds() const {
  std::vector<std::pair<std::string, double>> s;
  for (const auto& e : entries_) s.emplace_back(e.hook->name(), e.seconds);
  return s;
}

std::vector<std::string> Hooks::names() {
  order();
  std::vector<std::string> n;
  for (const auto& e : entries_) n.push_back(e.hook->name());
  return n;
}

}  // namespace lbbsp::runtime
