#include "runtime/io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runtime/io/h5.hpp"

namespace lbbsp::runtime {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".h5";

std::string checkpoint_name(int64_t iteration) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%012" PRId64 "%s", kPrefix, iteration, kSuffix);
  return buf;
}

// Iteration of a ckpt-<N>.h5 name, or -1.
int64_t iteration_of(const std::string& name) {
  const size_t p = std::strlen(kPrefix), s = std::strlen(kSuffix);
  if (name.size() <= p + s || name.compare(0, p, kPrefix) != 0 ||
      name.compare(name.size() - s, s, kSuffix) != 0)
    return -1;
  const std::string digits = name.substr(p, name.size() - p - s);
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit))
    return -1;
  return std::stoll(digits);
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw std::runtime_error("cannot open folder '" + dir + "' to fsync: " + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error("fsync of folder '" + dir + "' failed: " + std::strerror(err));
}

std::string to_hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// The identity and the small fields travel as one JSON document inside the file (covered by the checksum).
nlohmann::json meta_of(const CheckpointIdentity& id, const TrainState& st) {
  return {{"model", id.model},
          {"num_params", id.num_params},
          {"global_batch", id.global_batch},
          {"train_samples", id.train_samples},
          {"input_shape", id.input_shape},
          {"classes", id.classes},
          {"seed", id.seed},
          {"iteration", st.iteration},
          {"ranks", st.ranks},
          {"lag", st.lag},
          {"balancer", st.balancer},
          {"stats", st.stats},
          {"optimizer", to_json(st.optimizer)}};
}

uint64_t checksum(const std::string& meta, const TrainState& st) {
  uint64_t h = fnv1a64(meta.data(), meta.size());
  h = fnv1a64(st.params.data(), st.params.size() * sizeof(float), h);
  h = fnv1a64(st.velocity.data(), st.velocity.size() * sizeof(float), h);
  h = fnv1a64(st.batch.data(), st.batch.size() * sizeof(int64_t), h);
  h = fnv1a64(st.pending.data(), st.pending.size() * sizeof(int64_t), h);
  return fnv1a64(st.balancer_state.data(), st.balancer_state.size(), h);
}

void write_bytes(hid_t loc, const std::string& name, const std::string& s) {
  h5::write_u8(loc, name, reinterpret_cast<const uint8_t*>(s.data()), {static_cast<hsize_t>(s.size())},
               false);
}

std::string read_bytes(hid_t loc, const std::string& name, const std::string& file) {
  h5::Handle ds = h5::open_dataset(loc, name, file);
  auto d = h5::dims(ds);
  if (d.size() != 1) throw CheckpointCorrupt("dataset '" + name + "' has the wrong rank");
  std::string s(d[0], '\0');
  if (d[0] > 0 && H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()) < 0)
    throw CheckpointCorrupt("cannot read dataset '" + name + "'");
  return s;
}

template <class T>
void expect_equal(const char* what, const T& have, const T& want, const std::string& path, const char* hint) {
  if (have == want) return;
  throw std::invalid_argument("checkpoint '" + path + "' was written for " + what + " " +
                              nlohmann::json(have).dump() + ", this run has " + nlohmann::json(want).dump() +
                              " (" + hint + ")");
}

// Checkpoints record the optimiser since before the first release; the ones written before (format 1 too,
// without "optimizer" in their metadata) are refused: docs/checkpoints.md.
bool has_optimizer_record(const nlohmann::json& meta) {
  return meta.contains("optimizer") && !meta.at("optimizer").is_null();
}

[[noreturn]] void refuse_without_optimizer_record(const std::string& path) {
  throw std::invalid_argument(
      "checkpoint '" + path +
      "' has format 1 without an optimiser record (written by an unreleased lbbsp, "
      "before checkpoints recorded --lr, --lr-schedule, --warmup-iterations, --momentum "
      "and --weight-decay); this lbbsp reads format 1 with that record only "
      "(docs/checkpoints.md). Start afresh: run without --resume, or with a new "
      "--checkpoint-dir");
}

// The whole checkpoint as an HDF5 file image built in memory: HDF5 never touches the disk, so a full disk
// fails our own write() below cleanly (a failed H5Fclose on a real file leaves HDF5 to crash at exit).
std::string file_image(const TrainState& st, const std::string& meta) {
  h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (H5Pset_fapl_core(fapl, 1 << 20, 0) < 0)
    throw std::runtime_error("cannot set up an in-memory HDF5 file");
  h5::Handle f(H5Fcreate("checkpoint-in-memory.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
  if (!f.valid()) throw std::runtime_error("cannot create an in-memory HDF5 file");
  h5::write_f32(f, "params", st.params.data(), {st.params.size()});
  h5::write_f32(f, "velocity", st.velocity.data(), {st.velocity.size()});
  h5::write_i64(f, "batch", st.batch.data(), {st.batch.size()});
  if (!st.pending.empty()) h5::write_i64(f, "pending", st.pending.data(), {st.pending.size()});
  write_bytes(f, "balancer_state", st.balancer_state);
  write_bytes(f, "meta", meta);
  {
    h5::Handle root(H5Gopen2(f, "/", H5P_DEFAULT));
    h5::write_i64_attr(root, "format_version", kCheckpointFormatVersion);
    h5::write_string_attr(root, "checksum_fnv1a64", to_hex(checksum(meta, st)));
  }
  if (H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) throw std::runtime_error("cannot flush the in-memory HDF5 file");
  const ssize_t n = H5Fget_file_image(f, nullptr, 0);
  if (n <= 0) throw std::runtime_error("cannot get the HDF5 file image");
  std::string image(static_cast<size_t>(n), '\0');
  if (H5Fget_file_image(f, image.data(), image.size()) != n)
    throw std::runtime_error("cannot get the HDF5 file image");
  return image;
}

// write() + fsync(), every error (ENOSPC, EFBIG, EIO) reported with the path.
void write_file(const std::string& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create '" + path + "': " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int err = w < 0 ? errno : ENOSPC;
      ::close(fd);
      throw std::runtime_error("cannot write '" + path + "': " + std::strerror(err));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    throw std::runtime_error("fsync of '" + path + "' failed: " + std::strerror(err));
  }
  if (::close(fd) != 0) throw std::runtime_error("cannot close '" + path + "': " + std::strerror(errno));
}

}  // namespace

nlohmann::json to_json(const OptimizerRecord& r) {
  return {{"schedule", r.schedule},     {"lr", r.lr},
          {"warmup", r.warmup},         {"horizon", r.horizon},
          {"step_every", r.step_every}, {"step_gamma", r.step_gamma},
          {"momentum", r.momentum},     {"weight_decay", r.weight_decay}};
}

OptimizerRecord optimizer_record_from_json(const nlohmann::json& j) {
  OptimizerRecord r;
  r.schedule = j.at("schedule").get<std::string>();
  r.lr = j.at("lr").get<double>();
  r.warmup = j.at("warmup").get<int64_t>();
  r.horizon = j.at("horizon").get<int64_t>();
  r.step_every = j.at("step_every").get<int64_t>();
  r.step_gamma = j.at("step_gamma").get<double>();
  r.momentum = j.at("momentum").get<double>();
  r.weight_decay = j.at("weight_decay").get<double>();
  return r;
}

std::vector<std::string> optimizer_changes(const OptimizerRecord& was, const OptimizerRecord& now) {
  std::vector<std::string> out;
  auto differ = [&out](const char* what, const auto& a, const auto& b) {
    if (a != b)
      out.push_back(std::string(what) + ": " + nlohmann::json(a).dump() + " in the checkpoint, " +
                    nlohmann::json(b).dump() + " now");
  };
  differ("learning rate (--lr)", was.lr, now.lr);
  differ("schedule (--lr-schedule)", was.schedule, now.schedule);
  if (was.schedule == now.schedule) {  // the shape's parameters only compare within one kind
    differ("step interval (--lr-schedule step:EVERY:GAMMA)", was.step_every, now.step_every);
    differ("step factor (--lr-schedule step:EVERY:GAMMA)", was.step_gamma, now.step_gamma);
    differ("cosine horizon in iterations (--epochs, --max-iterations)", was.horizon, now.horizon);
  }
  differ("warm-up (--warmup-iterations)", was.warmup, now.warmup);
  differ("momentum (--momentum)", was.momentum, now.momentum);
  differ("weight decay (--weight-decay)", was.weight_decay, now.weight_decay);
  return out;
}

std::string write_checkpoint(const std::string& dir, const CheckpointIdentity& id, const TrainState& st,
                             int keep) {
  h5::quiet_errors();
  fs::create_directories(dir);
  const std::string path = (fs::path(dir) / checkpoint_name(st.iteration)).string();
  const std::string tmp = path + ".tmp";
  const std::string meta = meta_of(id, st).dump();
  try {
    write_file(tmp, file_image(st, meta));
    read_checkpoint(tmp, id);  // read back and verified before it can replace anything
    fs::rename(tmp, path);
    fsync_dir(dir);  // the rename itself is durable
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  auto all = list_checkpoints(dir);
  for (size_t i = std::max(keep, 1); i < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i], ec);
  }
  return path;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t it = iteration_of(e.path().filename().string());
    if (it >= 0 && e.is_regular_file()) found.emplace_back(it, e.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

TrainState read_checkpoint(const std::string& path, const CheckpointIdentity& want) {
  h5::quiet_errors();
  TrainState st;
  nlohmann::json meta;
  try {
    h5::Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!f.valid()) throw CheckpointCorrupt("not a readable HDF5 file");
    h5::Handle root(H5Gopen2(f, "/", H5P_DEFAULT));
    int64_t version = 0;
    if (!h5::read_i64_attr(root, "format_version", &version)) throw CheckpointCorrupt("no format_version");
    if (version != kCheckpointFormatVersion)
      throw CheckpointCorrupt("format version " + std::to_string(version) + ", this lbbsp reads " +
                              std::to_string(kCheckpointFormatVersion));
    const std::string stored = h5::read_string_attr(root, "checksum_fnv1a64");
    st.params = h5::read_f32(f, "params", path);
    st.velocity = h5::read_f32(f, "velocity", path);
    st.batch = h5::read_i64(f, "batch", path);
    if (h5::exists(f, "pending")) st.pending = h5::read_i64(f, "pending", path);
    st.balancer_state = read_bytes(f, "balancer_state", path);
    const std::string meta_text = read_bytes(f, "meta", path);
    if (to_hex(checksum(meta_text, st)) != stored)
      throw CheckpointCorrupt("checksum mismatch (stored " + (stored.empty() ? "nothing" : stored) + ")");
    meta = nlohmann::json::parse(meta_text);
    st.iteration = meta.at("iteration").get<int64_t>();
    st.ranks = meta.at("ranks").get<int>();
    st.lag = meta.at("lag").get<int>();
    st.balancer = meta.at("balancer").get<std::string>();
    st.stats = meta.at("stats");
    if (has_optimizer_record(meta)) st.optimizer = optimizer_record_from_json(meta.at("optimizer"));
  } catch (const CheckpointCorrupt& e) {
    throw CheckpointCorrupt("checkpoint '" + path + "' is corrupt: " + e.what());
  } catch (const std::exception& e) {
    throw CheckpointCorrupt("checkpoint '" + path + "' is corrupt: " + e.what());
  }
  if (!has_optimizer_record(meta)) refuse_without_optimizer_record(path);
  // Valid bytes: now is it the same training?
  expect_equal("model", meta.at("model").get<std::string>(), want.model, path, "--model");
  expect_equal("global batch", meta.at("global_batch").get<int64_t>(), want.global_batch, path,
               "--global-batch");
  expect_equal("dataset input shape", meta.at("input_shape").get<std::vector<int64_t>>(), want.input_shape,
               path, "--data");
  expect_equal("dataset classes", meta.at("classes").get<int64_t>(), want.classes, path, "--data");
  expect_equal("parameter count", meta.at("num_params").get<int64_t>(), want.num_params, path,
               "--model/--hidden or the dataset's input shape differ");
  expect_equal("training samples", meta.at("train_samples").get<int64_t>(), want.train_samples, path,
               "--data/--train-subset");
  expect_equal("seed", meta.at("seed").get<uint64_t>(), want.seed, path,
               "--seed: the data order depends on it");
  if (st.params.size() != static_cast<size_t>(want.num_params) || st.velocity.size() != st.params.size())
    throw CheckpointCorrupt("checkpoint '" + path + "' is corrupt: parameter arrays have the wrong length");
  return st;
}

TrainState load_newest_checkpoint(const std::string& dir, const CheckpointIdentity& want,
                                  std::string* used_path, std::vector<std::string>* skipped) {
  const auto all = list_checkpoints(dir);
  if (all.empty())
    throw std::invalid_argument("--resume: no checkpoint (ckpt-*.h5) in --checkpoint-dir '" + dir + "'");
  std::vector<std::string> corrupt;
  for (const auto& path : all) {
    try {
      TrainState st = read_checkpoint(path, want);
      if (used_path) *used_path = path;
      if (skipped) *skipped = corrupt;
      return st;
    } catch (const CheckpointCorrupt& e) {
      corrupt.push_back(e.what());
    }
  }
  std::string msg = "--resume: no valid checkpoint in '" + dir + "':";
  for (const auto& c : corrupt) msg += "\n  " + c;
  throw std::invalid_argument(msg);
}

}  // namespace lbbsp::runtime
