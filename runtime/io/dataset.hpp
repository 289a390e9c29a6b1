// Datasets in HDF5: /train/images (N, ...) uint8, /train/labels (N) uint8, /test/... likewise.
// A reader serves any list of row indices, from memory when the split fits, else by HDF5 hyperslabs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "runtime/io/h5.hpp"

namespace lbbsp::runtime {

class Dataset {
 public:
  // split: "train" or "test". memory_limit_bytes: load into memory when the images fit, else read on demand.
  // Throws std::runtime_error naming the file and the problem (missing datasets, bad shapes, labels out of
  // range).
  Dataset(const std::string& path, const std::string& split, size_t memory_limit_bytes = size_t(4) << 30);
  ~Dataset();

  int64_t size() const { return rows_; }
  int classes() const { return classes_; }
  models::InputShape shape() const { return shape_; }
  bool in_memory() const { return !images_.empty() || rows_ == 0; }
  const std::string& path() const { return path_; }

  // Fills x (n * shape().size() floats, pixel/255) and y (n labels) for the given rows.
  void gather(const int64_t* rows, int64_t n, float* x, uint8_t* y) const;

 private:
  std::string path_, split_;
  int64_t rows_ = 0;
  int64_t row_bytes_ = 0;
  int classes_ = 0;
  models::InputShape shape_;
  std::vector<uint8_t> images_;  // empty when reading on demand
  std::vector<uint8_t> labels_;  // always in memory (one byte per row)
  h5::Handle file_, images_ds_;  // kept open for on-demand reads
};

// `lbbsp data import-fashion-mnist`: IDX (gzip or plain) -> HDF5. Returns rows written (train, test).
std::pair<int64_t, int64_t> import_fashion_mnist(const std::string& src_dir, const std::string& out_path);

// `lbbsp data synth`: a learnable synthetic classification set (Gaussian class prototypes, quantised to
// uint8).
void write_synthetic(int64_t samples, int features, int classes, uint64_t seed, const std::string& out_path,
                     int64_t test_samples = -1);

}  // namespace lbbsp::runtime
