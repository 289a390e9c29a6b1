#include "runtime/io/h5.hpp"

#include <stdexcept>

#include "runtime/io/check.hpp"

namespace lbbsp::runtime {

void throw_call_failed(const char* lib, const char* call, long code, const char* file, int line) {
  throw std::runtime_error(std::string(lib) + " call failed (code " + std::to_string(code) + "): " + call +
                           " at " + file + ":" + std::to_string(line));
}

namespace h5 {

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    this->~Handle();
    id_ = o.id_;
    o.id_ = -1;
  }
  return *this;
}

Handle::~Handle() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      H5Fclose(id_);
      break;
    case H5I_GROUP:
      H5Gclose(id_);
      break;
    case H5I_DATASET:
      H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      H5Tclose(id_);
      break;
    case H5I_ATTR:
      H5Aclose(id_);
      break;
    case H5I_GENPROP_LST:
      H5Pclose(id_);
      break;
    default:
      break;
  }
  id_ = -1;
}

void quiet_errors() {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

Handle open_file(const std::string& path, bool write) {
  quiet_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    throw std::runtime_error("'" + path +
                             "' is not a readable HDF5 file (missing, truncated or another format)");
  }
  hid_t f = H5Fopen(path.c_str(), write ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("cannot open HDF5 file '" + path + "'");
  return Handle(f);
}

Handle create_file(const std::string& path) {
  quiet_errors();
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0)
    throw std::runtime_error("cannot create HDF5 file '" + path +
                             "' (check the folder exists and is writable)");
  return Handle(f);
}

bool exists(hid_t loc, const std::string& path) {
  // Check each component so that a missing parent group is "absent", not an error.
  size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    std::string part = path.substr(0, pos);
    if (!part.empty() && part != "/" && H5Lexists(loc, part.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

Handle open_dataset(hid_t loc, const std::string& path, const std::string& file_for_errors) {
  if (!exists(loc, path)) throw std::runtime_error("'" + file_for_errors + "' has no dataset '" + path + "'");
  hid_t d = H5Dopen2(loc, path.c_str(), H5P_DEFAULT);
  if (d < 0) throw std::runtime_error("cannot open dataset '" + path + "' in '" + file_for_errors + "'");
  return Handle(d);
}

std::vector<hsize_t> dims(hid_t dataset) {
  Handle space(H5Dget_space(dataset));
  int rank = H5Sget_simple_extent_ndims(space);
  LBBSP_H5_CHECK(rank);
  std::vector<hsize_t> d(rank);
  if (rank > 0) LBBSP_H5_CHECK(H5Sget_simple_extent_dims(space, d.data(), nullptr));
  return d;
}

Handle ensure_group(hid_t loc, const std::string& path) {
  if (exists(loc, path)) return Handle(H5Gopen2(loc, path.c_str(), H5P_DEFAULT));
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t g = H5Gcreate2(loc, path.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT);
  LBBSP_H5_CHECK(g);
  return Handle(g);
}

namespace {
void write_any(hid_t loc, const std::string& name, hid_t type, const void* data,
               const std::vector<hsize_t>& d, bool compress) {
  Handle space(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr));
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  size_t total = 1;
  for (auto x : d) total *= x;
  if (compress && total > 0 && !d.empty()) {
    std::vector<hsize_t> chunk = d;
    chunk[0] = std::min<hsize_t>(d[0], 1024);
    LBBSP_H5_CHECK(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
    LBBSP_H5_CHECK(H5Pset_deflate(dcpl, 4));
  }
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl, 1);
  Handle ds(H5Dcreate2(loc, name.c_str(), type, space, lcpl, dcpl, H5P_DEFAULT));
  LBBSP_H5_CHECK(ds.get());
  if (total > 0) LBBSP_H5_CHECK(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

template <typename T>
std::vector<T> read_any(hid_t loc, const std::string& name, hid_t type, const std::string& file) {
  Handle ds = open_dataset(loc, name, file);
  size_t total = 1;
  for (auto x : dims(ds)) total *= x;
  std::vector<T> out(total);
  if (total > 0 && H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) {
    throw std::runtime_error("cannot read dataset '" + name + "' of '" + file + "' (corrupt or truncated?)");
  }
  return out;
}
}  // namespace

void write_u8(hid_t loc, const std::string& name, const uint8_t* data, const std::vector<hsize_t>& d,
              bool compress) {
  write_any(loc, name, H5T_NATIVE_UINT8, data, d, compress);
}
void write_f32(hid_t loc, const std::string& name, const float* data, const std::vector<hsize_t>& d) {
  write_any(loc, name, H5T_NATIVE_FLOAT, data, d, false);
}
void write_f64(hid_t loc, const std::string& name, const double* data, const std::vector<hsize_t>& d) {
  write_any(loc, name, H5T_NATIVE_DOUBLE, data, d, false);
}
void write_i64(hid_t loc, const std::string& name, const int64_t* data, const std::vector<hsize_t>& d) {
  write_any(loc, name, H5T_NATIVE_INT64, data, d, false);
}
void write_i32(hid_t loc, const std::string& name, const int32_t* data, const std::vector<hsize_t>& d) {
  write_any(loc, name, H5T_NATIVE_INT32, data, d, false);
}

void write_string_attr(hid_t loc, const std::string& name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1));
  LBBSP_H5_CHECK(H5Tset_size(type, value.empty() ? 1 : value.size()));
  Handle space(H5Screate(H5S_SCALAR));
  if (H5Aexists(loc, name.c_str()) > 0) H5Adelete(loc, name.c_str());
  Handle attr(H5Acreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT));
  LBBSP_H5_CHECK(attr.get());
  LBBSP_H5_CHECK(H5Awrite(attr, type, value.empty() ? "" : value.c_str()));
}

void write_strings_attr(hid_t loc, const std::string& name, const std::vector<std::string>& values) {
  Handle type(H5Tcopy(H5T_C_S1));
  LBBSP_H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  hsize_t n = values.size();
  Handle space(H5Screate_simple(1, &n, nullptr));
  std::vector<const char*> ptrs;
  for (auto& v : values) ptrs.push_back(v.c_str());
  Handle attr(H5Acreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT));
  LBBSP_H5_CHECK(attr.get());
  LBBSP_H5_CHECK(H5Awrite(attr, type, ptrs.data()));
}

void write_i64_attr(hid_t loc, const std::string& name, int64_t value) {
  Handle space(H5Screate(H5S_SCALAR));
  if (H5Aexists(loc, name.c_str()) > 0) H5Adelete(loc, name.c_str());
  Handle attr(H5Acreate2(loc, name.c_str(), H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT));
  LBBSP_H5_CHECK(attr.get());
  LBBSP_H5_CHECK(H5Awrite(attr, H5T_NATIVE_INT64, &value));
}

std::string read_string_attr(hid_t loc, const std::string& name) {
  if (H5Aexists(loc, name.c_str()) <= 0) return "";
  Handle attr(H5Aopen(loc, name.c_str(), H5P_DEFAULT));
  Handle type(H5Aget_type(attr));
  if (H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) > 0) return "";
  size_t n = H5Tget_size(type);
  std::string s(n, '\0');
  LBBSP_H5_CHECK(H5Aread(attr, type, s.data()));
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

bool read_i64_attr(hid_t loc, const std::string& name, int64_t* value) {
  if (H5Aexists(loc, name.c_str()) <= 0) return false;
  Handle attr(H5Aopen(loc, name.c_str(), H5P_DEFAULT));
  return H5Aread(attr, H5T_NATIVE_INT64, value) >= 0;
}

std::vector<float> read_f32(hid_t loc, const std::string& name, const std::string& file) {
  return read_any<float>(loc, name, H5T_NATIVE_FLOAT, file);
}
std::vector<double> read_f64(hid_t loc, const std::string& name, const std::string& file) {
  return read_any<double>(loc, name, H5T_NATIVE_DOUBLE, file);
}
std::vector<int64_t> read_i64(hid_t loc, const std::string& name, const std::string& file) {
  return read_any<int64_t>(loc, name, H5T_NATIVE_INT64, file);
}

}  // namespace h5
}  // namespace lbbsp::runtime
