// libFuzzer target: the dataset loader (runtime::Dataset) on an HDF5 file built from the input: which
// datasets exist, their shapes, element types, label values, the num_classes attribute. HDF5's own parser is
// not the target (the file is always well-formed HDF5); our validation of what it holds is. The loader must
// load it or throw std::runtime_error naming the problem, and a loaded dataset must hold only labels <
// classes().
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/io/dataset.hpp"
#include "runtime/io/h5.hpp"

namespace h5 = lbbsp::runtime::h5;

namespace {
void write_split(hid_t f, const std::string& split, FuzzedDataProvider& in) {
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) return;  // split missing
  h5::Handle g = h5::ensure_group(f, "/" + split);
  const int rank = in.ConsumeIntegralInRange<int>(0, 5);
  std::vector<hsize_t> dims;
  hsize_t total = 1;
  for (int i = 0; i < rank; ++i) {
    dims.push_back(in.ConsumeIntegralInRange<hsize_t>(0, 9));
    total *= dims.back();
  }
  if (rank == 0) dims = {}, total = 1;
  std::vector<uint8_t> pixels(total);
  for (auto& p : pixels) p = in.ConsumeIntegral<uint8_t>();
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0 && rank > 0) {
    std::vector<float> fl(pixels.begin(), pixels.end());
    h5::write_f32(g, "images", fl.data(), dims);  // wrong element type
  } else if (rank > 0) {
    h5::write_u8(g, "images", pixels.data(), dims, false);
  }
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) return;  // labels missing
  hsize_t n = rank > 0 && in.ConsumeBool() ? dims[0] : in.ConsumeIntegralInRange<hsize_t>(0, 9);
  std::vector<uint8_t> labels(n);
  for (auto& l : labels) l = in.ConsumeIntegralInRange<uint8_t>(0, in.ConsumeBool() ? 3 : 255);
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {
    std::vector<uint8_t> two(2 * n, 1);
    h5::write_u8(g, "labels", two.data(), {n, 2}, false);
  } else {
    h5::write_u8(g, "labels", labels.data(), {n}, false);
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/lbbsp-fuzz-data-" + std::to_string(getpid()) + ".h5";
  FuzzedDataProvider in(data, size);
  h5::quiet_errors();
  try {
    h5::Handle f = h5::create_file(path);
    write_split(f, "train", in);
    write_split(f, "test", in);
    if (in.ConsumeBool()) {
      h5::Handle root(H5Gopen2(f, "/", H5P_DEFAULT));
      h5::write_i64_attr(root, "num_classes", in.ConsumeIntegralInRange<int64_t>(-3, 300));
    }
  } catch (const std::exception&) {
    std::remove(path.c_str());
    return 0;  // HDF5 refused what we asked to write (e.g. zero-size chunk): not the loader's business
  }
  for (const char* split : {"train", "test"}) {
    try {
      lbbsp::runtime::Dataset d(path, split, in.ConsumeBool() ? (1u << 20) : 0);
      std::vector<int64_t> rows;
      for (int64_t r = 0; r < d.size(); ++r) rows.push_back(r);
      std::vector<float> x(rows.size() * d.shape().size());
      std::vector<uint8_t> y(rows.size());
      d.gather(rows.data(), static_cast<int64_t>(rows.size()), x.data(), y.data());
      for (uint8_t label : y) {
        if (label >= d.classes()) __builtin_trap();
      }
    } catch (const std::runtime_error&) {
    } catch (const std::invalid_argument&) {
    }
  }
  std::remove(path.c_str());
  return 0;
}
