// Small RAII wrappers over the HDF5 C API (hid_t handles closed on scope exit) and helpers we use everywhere.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lbbsp::runtime::h5 {

// Owns one hid_t and closes it with the right H5*close for its type.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept;
  ~Handle();
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
};

// Silences HDF5's own stack printing: we report errors ourselves, naming the file.
void quiet_errors();

Handle open_file(const std::string& path, bool write);  // throws naming the path
Handle create_file(const std::string& path);            // truncates
Handle open_dataset(hid_t loc, const std::string& path, const std::string& file_for_errors);
bool exists(hid_t loc, const std::string& path);
std::vector<hsize_t> dims(hid_t dataset);
Handle ensure_group(hid_t loc, const std::string& path);

void write_u8(hid_t loc, const std::string& name, const uint8_t* data, const std::vector<hsize_t>& dims,
              bool compress);
void write_f32(hid_t loc, const std::string& name, const float* data, const std::vector<hsize_t>& dims);
void write_f64(hid_t loc, const std::string& name, const double* data, const std::vector<hsize_t>& dims);
void write_i64(hid_t loc, const std::string& name, const int64_t* data, const std::vector<hsize_t>& dims);
void write_i32(hid_t loc, const std::string& name, const int32_t* data, const std::vector<hsize_t>& dims);
void write_string_attr(hid_t loc, const std::string& name, const std::string& value);
void write_strings_attr(hid_t loc, const std::string& name, const std::vector<std::string>& values);
void write_i64_attr(hid_t loc, const std::string& name, int64_t value);
std::string read_string_attr(hid_t loc, const std::string& name);  // "" when absent
bool read_i64_attr(hid_t loc, const std::string& name, int64_t* value);

std::vector<float> read_f32(hid_t loc, const std::string& name, const std::string& file_for_errors);
std::vector<double> read_f64(hid_t loc, const std::string& name, const std::string& file_for_errors);
std::vector<int64_t> read_i64(hid_t loc, const std::string& name, const std::string& file_for_errors);

}  // namespace lbbsp::runtime::h5
