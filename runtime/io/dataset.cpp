#include "runtime/io/dataset.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <stdexcept>

#include "runtime/io/check.hpp"

namespace lbbsp::runtime {

namespace {
const std::vector<std::string> kFashionClasses = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
}

Dataset::Dataset(const std::string& path, const std::string& split, size_t memory_limit_bytes)
    : path_(path), split_(split) {
  file_ = h5::open_file(path, false);
  const std::string img = "/" + split + "/images", lab = "/" + split + "/labels";
  images_ds_ = h5::open_dataset(file_, img, path);
  h5::Handle labels_ds = h5::open_dataset(file_, lab, path);
  auto d = h5::dims(images_ds_);
  auto ld = h5::dims(labels_ds);
  if (d.size() < 2 || d.size() > 4) {
    throw std::runtime_error("'" + path + "': " + img +
                             " must have shape (N, F), (N, H, W) or (N, C, H, W), got " +
                             std::to_string(d.size()) + " dimensions");
  }
  if (ld.size() != 1 || ld[0] != d[0]) {
    throw std::runtime_error("'" + path + "': " + lab + " must have shape (" + std::to_string(d[0]) +
                             ",) to match " + img);
  }
  {
    h5::Handle t(H5Dget_type(images_ds_));
    if (H5Tget_class(t) != H5T_INTEGER || H5Tget_size(t) != 1) {
      throw std::runtime_error("'" + path + "': " + img + " must be uint8");
    }
  }
  rows_ = static_cast<int64_t>(d[0]);
  if (d.size() == 2) shape_ = {1, 1, static_cast<int>(d[1])};
  if (d.size() == 3) shape_ = {1, static_cast<int>(d[1]), static_cast<int>(d[2])};
  if (d.size() == 4) shape_ = {static_cast<int>(d[1]), static_cast<int>(d[2]), static_cast<int>(d[3])};
  row_bytes_ = shape_.size();
  if (row_bytes_ <= 0) throw std::runtime_error("'" + path + "': " + img + " has empty samples");

  labels_.resize(rows_);
  if (rows_ > 0 && H5Dread(labels_ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels_.data()) < 0) {
    throw std::runtime_error("cannot read " + lab + " of '" + path + "' (corrupt or truncated?)");
  }
  int64_t declared = 0;
  h5::Handle root(H5Gopen2(file_, "/", H5P_DEFAULT));
  int max_label = rows_ ? *std::max_element(labels_.begin(), labels_.end()) : 0;
  if (h5::read_i64_attr(root, "num_classes", &declared)) {
    if (declared < 2 || declared > 256)  // labels are uint8 (found by tests/fuzz/fuzz_dataset)
      throw std::runtime_error("'" + path + "': attribute num_classes = " + std::to_string(declared) +
                               " must be in 2..256");
    classes_ = static_cast<int>(declared);
    if (max_label >= classes_) {
      auto it = std::find_if(labels_.begin(), labels_.end(), [&](uint8_t v) { return v >= classes_; });
      throw std::runtime_error("'" + path + "': " + lab + "[" + std::to_string(it - labels_.begin()) +
                               "] = " + std::to_string(*it) +
                               " is out of range for num_classes = " + std::to_string(classes_));
    }
  } else {
    classes_ = max_label + 1;
  }
  if (classes_ < 2) throw std::runtime_error("'" + path + "': fewer than 2 classes in " + lab);

  if (static_cast<size_t>(rows_ * row_bytes_) <= memory_limit_bytes) {
    images_.resize(rows_ * row_bytes_);
    if (rows_ > 0 &&
        H5Dread(images_ds_, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, images_.data()) < 0) {
      throw std::runtime_error("cannot read " + img + " of '" + path + "' (corrupt or truncated?)");
    }
  }
}

Dataset::~Dataset() = default;

void Dataset::gather(const int64_t* rows, int64_t n, float* x, uint8_t* y) const {
  constexpr float kScale = 1.0f / 255.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= rows_) throw std::out_of_range("row index out of range of " + path_);
    y[i] = labels_[rows[i]];
  }
  if (n == 0) return;
  if (!images_.empty()) {
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* src = images_.data() + rows[i] * row_bytes_;
      float* dst = x + i * row_bytes_;
      for (int64_t k = 0; k < row_bytes_; ++k) dst[k] = src[k] * kScale;
    }
    return;
  }
  // Out of core: one hyperslab union per call, rows read in ascending order then scattered back.
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return rows[a] < rows[b]; });
  auto d = h5::dims(images_ds_);
  h5::Handle space(H5Dget_space(images_ds_));
  LBBSP_H5_CHECK(H5Sselect_none(space));
  std::vector<hsize_t> start(d.size(), 0), count = d;
  count[0] = 1;
  for (int64_t i = 0; i < n; ++i) {
    start[0] = static_cast<hsize_t>(rows[order[i]]);
    LBBSP_H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr));
  }
  // Duplicated rows collapse in a union: read the unique rows, then expand.
  std::vector<int64_t> unique_rows;
  for (int64_t i = 0; i < n; ++i)
    if (unique_rows.empty() || unique_rows.back() != rows[order[i]]) unique_rows.push_back(rows[order[i]]);
  std::vector<uint8_t> buf(unique_rows.size() * row_bytes_);
  hsize_t mem_n = buf.size();
  h5::Handle mem(H5Screate_simple(1, &mem_n, nullptr));
  if (H5Dread(images_ds_, H5T_NATIVE_UINT8, mem, space, H5P_DEFAULT, buf.data()) < 0) {
    throw std::runtime_error("cannot read rows of /" + split_ + "/images from '" + path_ + "'");
  }
  size_t u = 0;
  for (int64_t i = 0; i < n; ++i) {
    while (unique_rows[u] != rows[order[i]]) ++u;
    const uint8_t* src = buf.data() + u * row_bytes_;
    float* dst = x + order[i] * row_bytes_;
    for (int64_t k = 0; k < row_bytes_; ++k) dst[k] = src[k] * kScale;
  }
}

namespace {

// Reads a whole IDX file (gzip or plain: zlib reads both) and checks its magic number and size.
std::vector<uint8_t> read_idx(const std::string& path, int expected_ndims, std::vector<uint32_t>* dims) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f)
    throw std::runtime_error("cannot open IDX file '" + path +
                             "' (missing? install dataset-fashion-mnist or pass --src)");
  std::vector<uint8_t> all;
  uint8_t chunk[1 << 16];
  int got;
  while ((got = gzread(f, chunk, sizeof chunk)) > 0) all.insert(all.end(), chunk, chunk + got);
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string errmsg = msg ? msg : "";
  gzclose(f);
  if (got < 0 || (err != Z_OK && err != Z_STREAM_END)) {
    throw std::runtime_error("'" + path + "' is not a valid gzip/IDX file (" + errmsg +
                             "); is it truncated?");
  }
  if (all.size() < 4) throw std::runtime_error("'" + path + "' is too short to be an IDX file (truncated?)");
  if (all[0] != 0 || all[1] != 0 || all[2] != 0x08 || all[3] != expected_ndims) {
    throw std::runtime_error("'" + path + "' is not an IDX uint8 file with " +
                             std::to_string(expected_ndims) + " dimensions (bad magic number)");
  }
  size_t header = 4 + 4 * expected_ndims;
  if (all.size() < header) throw std::runtime_error("'" + path + "' is truncated inside its header");
  dims->clear();
  size_t total = 1;
  for (int i = 0; i < expected_ndims; ++i) {
    const uint8_t* p = all.data() + 4 + 4 * i;
    uint32_t v = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
    dims->push_back(v);
    total *= v;
  }
  if (all.size() - header != total) {
    throw std::runtime_error("'" + path + "' holds " + std::to_string(all.size() - header) +
                             " data bytes but its header announces " + std::to_string(total) +
                             " (truncated?)");
  }
  return std::vector<uint8_t>(all.begin() + header, all.end());
}

std::string find_idx(const std::string& dir, const std::string& stem) {
  for (const char* ext : {".gz", ""}) {
    std::string p = dir + "/" + stem + ext;
    if (std::filesystem::exists(p)) return p;
  }
  throw std::runtime_error("no '" + stem + "[.gz]' in '" + dir +
                           "' (install Debian's dataset-fashion-mnist or pass --src DIR)");
}

void write_split(hid_t file, const std::string& split, const std::vector<uint8_t>& images,
                 const std::vector<uint8_t>& labels, const std::vector<hsize_t>& image_dims) {
  h5::write_u8(file, "/" + split + "/images", images.data(), image_dims, true);
  h5::write_u8(file, "/" + split + "/labels", labels.data(), {labels.size()}, true);
}

void write_common_attrs(hid_t file, const std::string& source, const std::vector<std::string>& class_names) {
  h5::Handle root(H5Gopen2(file, "/", H5P_DEFAULT));
  h5::write_string_attr(root, "source", source);
  h5::write_strings_attr(root, "class_names", class_names);
  h5::write_i64_attr(root, "num_classes", static_cast<int64_t>(class_names.size()));
  h5::write_string_attr(root, "layout", "images uint8 (N,...) raw pixels 0..255; labels uint8 (N)");
}

// The temporary file an output is written to before its rename, in the output's folder, created if missing.
std::string temporary_output(const std::string& out_path) {
  const auto folder = std::filesystem::path(out_path).parent_path();
  std::error_code ec;
  if (!folder.empty()) std::filesystem::create_directories(folder, ec);
  if (ec) {
    throw std::runtime_error("cannot create the folder '" + folder.string() + "' for '" + out_path +
                             "': " + ec.message() + " (choose another --out)");
  }
  return out_path + ".tmp";
}

}  // namespace

std::pair<int64_t, int64_t> import_fashion_mnist(const std::string& src_dir, const std::string& out_path) {
  std::pair<int64_t, int64_t> counts;
  struct Part {
    const char* split;
    const char* images;
    const char* labels;
  };
  std::vector<std::vector<uint8_t>> imgs, labs;
  std::vector<std::vector<hsize_t>> img_dims;
  for (Part p : {Part{"train", "train-images-idx3-ubyte", "train-labels-idx1-ubyte"},
                 Part{"test", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}}) {
    std::vector<uint32_t> di, dl;
    std::string ipath = find_idx(src_dir, p.images), lpath = find_idx(src_dir, p.labels);
    imgs.push_back(read_idx(ipath, 3, &di));
    labs.push_back(read_idx(lpath, 1, &dl));
    if (di[0] != dl[0]) {
      throw std::runtime_error("'" + ipath + "' has " + std::to_string(di[0]) + " images but '" + lpath +
                               "' has " + std::to_string(dl[0]) + " labels");
    }
    for (size_t i = 0; i < labs.back().size(); ++i) {
      if (labs.back()[i] >= 10) {
        throw std::runtime_error("'" + lpath + "': label " + std::to_string(labs.back()[i]) + " at row " +
                                 std::to_string(i) + " is out of range 0..9");
      }
    }
    img_dims.push_back({di[0], di[1], di[2]});
  }
  auto tmp = temporary_output(out_path);
  {
    h5::Handle f = h5::create_file(tmp);
    write_split(f, "train", imgs[0], labs[0], img_dims[0]);
    write_split(f, "test", imgs[1], labs[1], img_dims[1]);
    write_common_attrs(f, "Fashion-MNIST (Zalando Research, MIT licence) IDX files from " + src_dir,
                       kFashionClasses);
  }
  std::filesystem::rename(tmp, out_path);
  counts = {static_cast<int64_t>(labs[0].size()), static_cast<int64_t>(labs[1].size())};
  return counts;
}

void write_synthetic(int64_t samples, int features, int classes, uint64_t seed, const std::string& out_path,
                     int64_t test_samples) {
  if (samples < 1) throw std::invalid_argument("--samples must be >= 1");
  if (features < 1) throw std::invalid_argument("--features must be >= 1");
  if (classes < 2 || classes > 256) throw std::invalid_argument("--classes must be in 2..256");
  if (test_samples < 0) test_samples = std::max<int64_t>(1, samples / 6);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  auto gauss = [&] {  // Box-Muller, portable across standard libraries
    double u1 = std::max(uni(rng), 1e-300), u2 = uni(rng);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  };
  // Class prototypes in [40, 215]; samples are prototype + noise, so classes overlap but are learnable.
  std::vector<double> proto(static_cast<size_t>(classes) * features);
  for (auto& v : proto) v = 40.0 + 175.0 * uni(rng);
  auto make = [&](int64_t n, std::vector<uint8_t>& x, std::vector<uint8_t>& y) {
    x.resize(static_cast<size_t>(n) * features);
    y.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      int c = static_cast<int>(uni(rng) * classes) % classes;
      y[i] = static_cast<uint8_t>(c);
      for (int f = 0; f < features; ++f) {
        double v = proto[static_cast<size_t>(c) * features + f] + 60.0 * gauss();
        x[static_cast<size_t>(i) * features + f] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  };
  std::vector<uint8_t> xtr, ytr, xte, yte;
  make(samples, xtr, ytr);
  make(test_samples, xte, yte);
  std::vector<std::string> names;
  for (int c = 0; c < classes; ++c) names.push_back("class" + std::to_string(c));
  auto tmp = temporary_output(out_path);
  {
    h5::Handle f = h5::create_file(tmp);
    // A perfect-square feature count is stored as a square image, so the CNN can train on it too.
    auto side = static_cast<hsize_t>(std::lround(std::sqrt(static_cast<double>(features))));
    auto dims = [&](int64_t n) {
      return side * side == static_cast<hsize_t>(features)
                 ? std::vector<hsize_t>{static_cast<hsize_t>(n), side, side}
                 : std::vector<hsize_t>{static_cast<hsize_t>(n), static_cast<hsize_t>(features)};
    };
    write_split(f, "train", xtr, ytr, dims(samples));
    write_split(f, "test", xte, yte, dims(test_samples));
    write_common_attrs(f, "lbbsp data synth --seed " + std::to_string(seed), names);
  }
  std::filesystem::rename(tmp, out_path);
}

}  // namespace lbbsp::runtime
