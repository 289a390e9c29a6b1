// Training checkpoints: one HDF5 file per checkpoint (ckpt-<iteration>.h5 in a folder), written atomically by
// rank 0 (temp file, fsync, rename, fsync of the folder), the newest K kept. A format version and an FNV-1a
// checksum over every byte of state guard the load; a checkpoint of another model, global batch, dataset or
// seed is refused; one whose optimiser (learning rate, schedule, momentum, weight decay) differs from the
// run's is refused unless the run allows it (optimizer_changes).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/hash.hpp"

namespace lbbsp::runtime {

// What a checkpoint must match to be resumed (anything else would silently train something different).
struct CheckpointIdentity {
  std::string model;
  int64_t num_params = 0;
  int64_t global_batch = 0;
  int64_t train_samples = 0;  // after --train-subset
  std::vector<int64_t> input_shape;
  int64_t classes = 0;
  uint64_t seed = 0;
};

// What the optimiser does at each iteration; a resume that changes it continues on another trajectory.
struct OptimizerRecord {
  std::string schedule;     // constant, step, cosine
  double lr = 0;            // the schedule's base rate (--lr)
  int64_t warmup = 0;       // --warmup-iterations
  int64_t horizon = 0;      // cosine: the iteration its decay reaches 0 (--epochs, --max-iterations); else 0
  int64_t step_every = 0;   // step:EVERY:GAMMA; else 0
  double step_gamma = 0;    // step; else 0
  double momentum = 0;      // --momentum
  double weight_decay = 0;  // --weight-decay
  bool operator==(const OptimizerRecord&) const = default;
};

nlohmann::json to_json(const OptimizerRecord& r);
OptimizerRecord optimizer_record_from_json(const nlohmann::json& j);

// The differences between the optimiser a checkpoint recorded and this run's, one phrase each naming the
// flags
// ("cosine horizon (--epochs, --max-iterations): 60 in the checkpoint, 100 now"); empty when they agree.
std::vector<std::string> optimizer_changes(const OptimizerRecord& recorded, const OptimizerRecord& now);

struct TrainState {
  int64_t iteration = 0;  // the next iteration to run
  int ranks = 0;          // rank count that wrote it (the batch vector and balancer state are per rank)
  int lag = 0;
  std::string balancer;  // --balancer spec whose state this is
  std::vector<float> params, velocity;
  std::vector<int64_t> batch;    // batch vector of `iteration`
  std::vector<int64_t> pending;  // lag L: the L batch vectors already decided after `batch` (R x L)
  std::string balancer_state;    // Balancer::save_state()
  nlohmann::json stats;          // the trainer's running statistics (summary, curve), opaque here
  OptimizerRecord optimizer;
};

// Bytes that fail their checksum or cannot be read at all.
struct CheckpointCorrupt : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr int kCheckpointFormatVersion = 1;

using lbbsp::fnv1a64;  // common/hash.hpp: the checksum over every byte of state

// Writes DIR/ckpt-<iteration>.h5 atomically and deletes all but the newest `keep`. Throws on I/O errors (a
// failed write leaves no partial ckpt-*.h5 behind: only a temp file that is removed).
std::string write_checkpoint(const std::string& dir, const CheckpointIdentity& id, const TrainState& st,
                             int keep);

// ckpt-*.h5 files of DIR, newest (highest iteration) first.
std::vector<std::string> list_checkpoints(const std::string& dir);

// Reads and verifies one checkpoint. Throws CheckpointCorrupt (unreadable, bad checksum, unknown format) or
// std::invalid_argument (valid but written for another model / global batch / dataset / seed).
TrainState read_checkpoint(const std::string& path, const CheckpointIdentity& expected);

// The newest valid checkpoint of DIR. A corrupt one is skipped (named in *skipped) when an older valid one
// exists; if none is valid, or one mismatches, throws std::invalid_argument naming the file and the reason.
TrainState load_newest_checkpoint(const std::string& dir, const CheckpointIdentity& expected,
                                  std::string* used_path, std::vector<std::string>* skipped);

}  // namespace lbbsp::runtime
