// The one buffer every iteration sums over all ranks (one allreduce carries the gradient and everything rank
// 0 needs to decide the next batch vector, so no rank waits for an extra message):
//
//   [ gradient sums (P) | loss sum, correct count (2) | R slots of kSlotFields floats | R next batch sizes ]
//
// Rank r writes only its own slot, so the sum delivers every rank's slot to every rank. The last R floats
// carry, with lag >= 1, the next iteration's batch vector, which rank 0 decided ahead (zero on the other
// ranks).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace lbbsp::runtime {

// The fields of a rank's slot.
enum Slot { kCompute = 0, kCpu, kMem, kLoad, kCapacity, kRealCompute, kStop, kSlotFields };

class ReductionBuffer {
 public:
  ReductionBuffer(size_t params, int ranks)
      : params_(params),
        ranks_(ranks),
        next_(params + 2 + static_cast<size_t>(ranks) * kSlotFields),
        data_(next_ + static_cast<size_t>(ranks)) {}

  int ranks() const { return ranks_; }
  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  size_t size() const { return data_.size(); }
  // Floats after the gradient (the StepEngine's "extra").
  size_t extra() const { return size() - params_; }
  // Floats that are neither gradient nor loss/correct (slots, batch sizes): their share of the allreduce time
  // is coordination.
  size_t coordination_floats() const { return size() - params_ - 2; }

  void clear() { std::fill(data_.begin(), data_.end(), 0.0f); }

  // This rank's loss sum and correct count; after the allreduce, the global ones.
  void set_totals(double loss_sum, int64_t correct) {
    data_[params_] = static_cast<float>(loss_sum);
    data_[params_ + 1] = static_cast<float>(correct);
  }
  double loss_sum() const { return data_[params_]; }
  double correct() const { return data_[params_ + 1]; }

  float* slot(int rank) { return data_.data() + params_ + 2 + static_cast<size_t>(rank) * kSlotFields; }
  const float* slot(int rank) const {
    return data_.data() + params_ + 2 + static_cast<size_t>(rank) * kSlotFields;
  }
  double field(int rank, Slot f) const { return slot(rank)[f]; }

  // After the allreduce: the slowest rank's compute time, and the sum over ranks of the time each waited
  // for it.
  double max_compute() const {
    double m = 0;
    for (int r = 0; r < ranks_; ++r) m = std::max<double>(m, slot(r)[kCompute]);
    return m;
  }
  double wait_sum(double max_compute) const {
    double w = 0;
    for (int r = 0; r < ranks_; ++r) w += max_compute - slot(r)[kCompute];
    return w;
  }
  // After the allreduce: the first non-zero stop signal in rank order (0: none).
  int stop_signal() const {
    for (int r = 0; r < ranks_; ++r)
      if (const int s = static_cast<int>(slot(r)[kStop])) return s;
    return 0;
  }

  void set_next_batch(const std::vector<int64_t>& b) {
    for (int r = 0; r < ranks_; ++r) data_[next_ + r] = static_cast<float>(b[r]);
  }
  std::vector<int64_t> next_batch() const {
    std::vector<int64_t> b(ranks_);
    for (int r = 0; r < ranks_; ++r) b[r] = static_cast<int64_t>(data_[next_ + r]);
    return b;
  }

 private:
  size_t params_;
  int ranks_;
  size_t next_;  // offset of the next batch sizes
  std::vector<float> data_;
};

}  // namespace lbbsp::runtime
