#include "runtime/straggle/straggler.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

namespace lbbsp::runtime {

Straggler::Straggler(const std::string& spec, int ranks, uint64_t seed)
    : config_(straggle::parse(spec, ranks, seed)),
      emulation_(straggle::make_emulation(config_)),
      gpu_(config_.gpu_curves, config_.gpu_caps),
      noise_state_(config_.seed * 0x9E3779B97F4A7C15ULL + 1) {}

Straggler::~Straggler() {
  stop_cotenant();
}

double Straggler::emulated_seconds(int rank, double elapsed_s, int64_t batch, double real_s) const {
  gpu_.check_memory(rank, batch);
  const double capacity = emulation_->replay_capacity(rank, elapsed_s);
  if (gpu_profile()) return std::max(real_s, gpu_.curve(rank, capacity).time(static_cast<double>(batch)));
  return real_s / capacity;  // real interference (stress) is never stretched: its replay capacity is 1
}

void Straggler::stretch_to(double real_s, double target_s) {
  if (target_s <= real_s) return;
  // Sleep to just short of the deadline, then yield until it: a thread woken from sleep comes back late
  // (0.1-0.2 ms on the 2-core test machine), which the emulated machine would not.
  constexpr double kSpin = 0.001;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(target_s - real_s);
  if (target_s - real_s > kSpin)
    std::this_thread::sleep_for(std::chrono::duration<double>(target_s - real_s - kSpin));
  while (std::chrono::steady_clock::now() < deadline) sched_yield();
}

// xorshift: cheap, portable and seeded (one stream per process, drawn in call order); a uniform in (0, 1).
double Straggler::next_uniform() {
  noise_state_ ^= noise_state_ << 13;
  noise_state_ ^= noise_state_ >> 7;
  noise_state_ ^= noise_state_ << 17;
  return ((noise_state_ >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

ResourceMetrics Straggler::metrics(int rank, double elapsed_s, const ResourceMetrics& measured) {
  emulation_->anchor_clock(elapsed_s);  // the trainer passes a fresh elapsed here
  if (!replay()) return measured;
  ResourceMetrics m = measured;
  double cpu = capacity(rank, elapsed_s);
  if (config_.noise_sd > 0) {
    // Box-Muller, written as one expression so that it rounds (and contracts to FMA) exactly as it always
    // did.
    const double u1 = next_uniform(), u2 = next_uniform();
    cpu += config_.noise_sd * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  m.cpu_avail = std::clamp(cpu, 0.0, 1.0);
  if (auto mem = emulation_->mem_avail(rank, elapsed_s)) m.mem_avail = *mem;
  return m;
}

}  // namespace lbbsp::runtime
