// runtime/io/checkpoint: round trip, newest-K pruning, names that are not checkpoints, corrupt and mismatched
// files, the optimiser record and files without it.
#include "runtime/io/checkpoint.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/io/h5.hpp"

namespace fs = std::filesystem;
using namespace lbbsp::runtime;

namespace {
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("lbbsp-ckpt-test-" + std::to_string(getpid()));
  TempDir() { fs::remove_all(path), fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

CheckpointIdentity identity() {
  CheckpointIdentity id;
  id.model = "mlp";
  id.num_params = 5;
  id.global_batch = 64;
  id.train_samples = 1000;
  id.input_shape = {1, 28, 28};
  id.classes = 10;
  id.seed = 3;
  return id;
}

TrainState state(int64_t iteration) {
  TrainState st;
  st.iteration = iteration;
  st.ranks = 2;
  st.lag = 1;
  st.balancer = "random:4";
  st.params = {1.5f, -2.0f, 0.0f, 3e-8f, -0.0f};
  st.velocity = {0.1f, 0.2f, 0.3f, 0.4f, static_cast<float>(iteration)};
  st.batch = {40, 24};
  st.pending = {0, 64};
  st.balancer_state = std::string("opaque\0bytes", 12);
  st.stats = {{"train_time", 1.25}, {"curve", nlohmann::json::array()}};
  return st;
}
}  // namespace

TEST(Checkpoint, RoundTripKeepsEveryByte) {
  TempDir d;
  auto path = write_checkpoint(d.path, identity(), state(7), 2);
  auto st = read_checkpoint(path, identity());
  auto want = state(7);
  EXPECT_EQ(st.iteration, 7);
  EXPECT_EQ(st.ranks, 2);
  EXPECT_EQ(st.lag, 1);
  EXPECT_EQ(st.balancer, "random:4");
  ASSERT_EQ(st.params.size(), want.params.size());
  EXPECT_EQ(0, std::memcmp(st.params.data(), want.params.data(), want.params.size() * sizeof(float)));
  EXPECT_EQ(st.velocity, want.velocity);
  EXPECT_EQ(st.batch, want.batch);
  EXPECT_EQ(st.pending, want.pending);
  EXPECT_EQ(st.balancer_state, want.balancer_state);
  EXPECT_EQ(st.stats, want.stats);
}

TEST(Checkpoint, KeepsTheNewestKAndIgnoresOtherNames) {
  TempDir d;
  std::ofstream(d.path / "ckpt-000000000099.h5.tmp") << "partial";
  std::ofstream(d.path / "notes.txt") << "x";
  for (int64_t it : {5, 10, 15, 20}) write_checkpoint(d.path, identity(), state(it), 2);
  auto all = list_checkpoints(d.path);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_NE(all[0].find("ckpt-000000000020.h5"), std::string::npos);
  EXPECT_NE(all[1].find("ckpt-000000000015.h5"), std::string::npos);
  std::string used;
  std::vector<std::string> skipped;
  EXPECT_EQ(load_newest_checkpoint(d.path, identity(), &used, &skipped).iteration, 20);
  EXPECT_TRUE(skipped.empty());
}

TEST(Checkpoint, CorruptNewestFallsBackAndAllCorruptIsRefused) {
  TempDir d;
  write_checkpoint(d.path, identity(), state(5), 2);
  auto newest = write_checkpoint(d.path, identity(), state(10), 2);
  {  // change one parameter through HDF5: a well-formed file whose checksum no longer matches
    h5::Handle f = h5::open_file(newest, true);
    float p[5] = {9, 9, 9, 9, 9};
    h5::Handle ds = h5::open_dataset(f, "params", newest);
    ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, p), 0);
  }
  EXPECT_THROW(read_checkpoint(newest, identity()), CheckpointCorrupt);
  std::string used;
  std::vector<std::string> skipped;
  EXPECT_EQ(load_newest_checkpoint(d.path, identity(), &used, &skipped).iteration, 5);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("checksum mismatch"), std::string::npos) << skipped[0];
  fs::resize_file(list_checkpoints(d.path)[1], 100);  // truncate the older one too
  EXPECT_THROW(load_newest_checkpoint(d.path, identity(), &used, &skipped), std::invalid_argument);
}

TEST(Checkpoint, AnotherTrainingIsRefusedNamingBothValues) {
  TempDir d;
  auto path = write_checkpoint(d.path, identity(), state(5), 2);
  auto other = identity();
  other.global_batch = 128;
  try {
    read_checkpoint(path, other);
    FAIL() << "a checkpoint of another global batch was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("written for global batch 64, this run has 128"), std::string::npos)
        << e.what();
  }
  other = identity();
  other.input_shape = {1, 1, 784};
  EXPECT_THROW(read_checkpoint(path, other), std::invalid_argument);
  other = identity();
  other.model = "cnn";
  EXPECT_THROW(read_checkpoint(path, other), std::invalid_argument);
}

namespace {
OptimizerRecord cosine(int64_t horizon) {
  OptimizerRecord r;
  r.schedule = "cosine";
  r.lr = 0.05;
  r.warmup = 10;
  r.horizon = horizon;
  r.momentum = 0.9;
  r.weight_decay = 1e-4;
  return r;
}
}  // namespace

TEST(Checkpoint, RecordsTheOptimizer) {
  TempDir d;
  auto st = state(9);
  st.optimizer = cosine(60);
  const auto back = read_checkpoint(write_checkpoint(d.path, identity(), st, 2), identity());
  EXPECT_EQ(back.optimizer, cosine(60));
}

namespace {
// Makes PATH (written from `st`) a checkpoint as lbbsp wrote them before they recorded the optimiser: the
// "optimizer" key of its metadata renamed in place (so absent), the checksum recomputed as lbbsp does.
void drop_optimizer_record(const std::string& path, const TrainState& st) {
  h5::Handle f = h5::open_file(path, true);
  h5::Handle ds = h5::open_dataset(f, "meta", path);
  std::string meta(h5::dims(ds)[0], '\0');
  ASSERT_GE(H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, meta.data()), 0);
  const size_t at = meta.find("\"optimizer\"");
  ASSERT_NE(at, std::string::npos) << meta;
  meta.replace(at, 11, "\"Optimizer\"");
  ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, meta.data()), 0);
  uint64_t h = fnv1a64(meta.data(), meta.size());
  h = fnv1a64(st.params.data(), st.params.size() * sizeof(float), h);
  h = fnv1a64(st.velocity.data(), st.velocity.size() * sizeof(float), h);
  h = fnv1a64(st.batch.data(), st.batch.size() * sizeof(int64_t), h);
  h = fnv1a64(st.pending.data(), st.pending.size() * sizeof(int64_t), h);
  h = fnv1a64(st.balancer_state.data(), st.balancer_state.size(), h);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, h);
  h5::Handle root(H5Gopen2(f, "/", H5P_DEFAULT));
  h5::write_string_attr(root, "checksum_fnv1a64", hex);
}
}  // namespace

// Checkpoints without the optimiser record were never released: one is refused (not skipped as corrupt),
// naming the file, the format found, the format read and the way out.
TEST(Checkpoint, OneWithoutTheOptimizerRecordIsRefusedNamingTheFix) {
  TempDir d;
  auto st = state(9);
  st.optimizer = cosine(60);
  const std::string path = write_checkpoint(d.path, identity(), st, 2);
  drop_optimizer_record(path, st);
  try {
    read_checkpoint(path, identity());
    FAIL() << "a checkpoint without the optimiser record was read";
  } catch (const CheckpointCorrupt& e) {
    FAIL() << "refused as corrupt (the test's checksum is wrong?): " << e.what();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    const std::vector<std::string> wants = {
        "checkpoint '" + path + "' has format 1 without an optimiser record",
        "this lbbsp reads format 1 with that record only", "run without --resume"};
    for (const std::string& want : wants) EXPECT_NE(what.find(want), std::string::npos) << what;
  }
  std::string used;
  std::vector<std::string> skipped;
  EXPECT_THROW(load_newest_checkpoint(d.path, identity(), &used, &skipped), std::invalid_argument);
}

TEST(Checkpoint, OptimizerChangesNameEachFlag) {
  EXPECT_TRUE(optimizer_changes(cosine(60), cosine(60)).empty());
  auto longer = optimizer_changes(cosine(60), cosine(100));
  ASSERT_EQ(longer.size(), 1u);
  EXPECT_EQ(longer[0],
            "cosine horizon in iterations (--epochs, --max-iterations): 60 in the checkpoint, 100 now");
  auto now = cosine(60);
  now.lr = 0.1, now.momentum = 0.5, now.weight_decay = 0, now.warmup = 0;
  const auto four = optimizer_changes(cosine(60), now);
  ASSERT_EQ(four.size(), 4u);
  EXPECT_NE(four[0].find("(--lr): 0.05 in the checkpoint, 0.1 now"), std::string::npos) << four[0];
  EXPECT_NE(four[1].find("--warmup-iterations"), std::string::npos) << four[1];
  EXPECT_NE(four[2].find("--momentum"), std::string::npos) << four[2];
  EXPECT_NE(four[3].find("--weight-decay"), std::string::npos) << four[3];
  // Another kind is one difference, not also its parameters (a constant schedule has no horizon).
  now = cosine(60);
  now.schedule = "constant", now.horizon = 0;
  const auto kind = optimizer_changes(cosine(60), now);
  ASSERT_EQ(kind.size(), 1u);
  EXPECT_EQ(kind[0], "schedule (--lr-schedule): \"cosine\" in the checkpoint, \"constant\" now");
}
