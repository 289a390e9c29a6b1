// Multi-format trace reader: PlanetLab, Bitbrains, Alibaba v2018, Azure VM noise 2024 and a plain CSV.
#include "runtime/analysis/traces.hpp"

#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string_view>

namespace lbbsp::runtime {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

[[noreturn]] void fail_at(const std::string& path, size_t line, const std::string& what) {
  throw std::runtime_error(path + ":" + std::to_string(line) + ": " + what);
}

// gzread passes plain (uncompressed) files through unchanged, so one reader serves both.
std::string read_maybe_gzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw std::runtime_error(path + ": cannot open trace file");
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    int n = gzread(file, buffer, sizeof buffer);
    if (n < 0) {
      int code = 0;
      std::string message = gzerror(file, &code);
      gzclose(file);
      throw std::runtime_error(path + ": cannot read trace file (" + message + ")");
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  gzclose(file);
  return text;
}

struct Line {
  size_t number;  // 1-based
  std::string_view text;
};

// Lines without their "\r\n" / "\n"; trailing blank lines dropped.
std::vector<Line> split_lines(const std::string& text) {
  std::vector<Line> lines;
  size_t start = 0, number = 1;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back({number++, line});
    start = end + 1;
  }
  while (!lines.empty() && lines.back().text.find_first_not_of(" \t") == std::string_view::npos)
    lines.pop_back();
  return lines;
}

std::string_view trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::vector<std::string_view> split_fields(std::string_view line, char sep) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  for (;;) {
    size_t end = line.find(sep, start);
    fields.push_back(
        trim(line.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start)));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return fields;
}

bool parse_number(std::string_view field, double& value) {
  field = trim(field);
  if (field.empty()) return false;
  if (field.front() == '+') field.remove_prefix(1);
  auto [ptr, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  return ec == std::errc() && ptr == field.data() + field.size();
}

// A required number: anything else is an error naming the file, line and column.
double number_at(const std::string& path, const Line& line, std::string_view field, const char* column) {
  double value;
  if (!parse_number(field, value) || !std::isfinite(value))
    fail_at(path, line.number, std::string("bad ") + column + " value '" + std::string(field) + "'");
  return value;
}

// An optional number: empty means missing (NaN); anything else unparsable is an error.
double optional_number_at(const std::string& path, const Line& line, std::string_view field,
                          const char* column) {
  if (trim(field).empty()) return kNaN;
  return number_at(path, line, field, column);
}

double clamp_capacity(double c) {
  return std::clamp(c, kMinCapacity, 1.0);
}

TraceSeries make_series(const std::string& source, const char* family, std::vector<std::string> exo_names) {
  TraceSeries s;
  s.source = source;
  s.family = family;
  s.exo_names = std::move(exo_names);
  s.exo.resize(s.exo_names.size());
  return s;
}

// Stable sort of all columns by time, then times made relative to the first sample.
void sort_and_rebase(TraceSeries& s) {
  std::vector<size_t> order(s.time_s.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s.time_s[a] < s.time_s[b]; });
  auto permute = [&](std::vector<double>& v) {
    std::vector<double> out(v.size());
    for (size_t i = 0; i < order.size(); ++i) out[i] = v[order[i]];
    v = std::move(out);
  };
  permute(s.time_s);
  permute(s.capacity);
  for (auto& column : s.exo) permute(column);
  if (!s.time_s.empty()) {
    double t0 = s.time_s.front();
    s.origin_s = t0;
    for (double& t : s.time_s) t -= t0;
  }
}

std::vector<TraceSeries> read_planetlab(const std::string& path, const std::vector<Line>& lines) {
  TraceSeries s = make_series(path, "planetlab", {});
  for (const Line& line : lines) {
    double util = number_at(path, line, line.text, "CPU %");
    s.time_s.push_back(300.0 * static_cast<double>(s.capacity.size()));
    s.capacity.push_back(clamp_capacity(1.0 - util / 100.0));
  }
  return {std::move(s)};
}

std::vector<TraceSeries> read_bitbrains(const std::string& path, const std::vector<Line>& lines) {
  constexpr size_t kColumns = 11;
  if (split_fields(lines[0].text, ';').size() != kColumns)
    fail_at(path, lines[0].number, "bitbrains header must have 11 ';'-separated columns");
  TraceSeries s =
      make_series(path, "bitbrains",
                  {"mem_used_frac", "disk_read_kBps", "disk_write_kBps", "net_rx_kBps", "net_tx_kBps"});
  for (size_t i = 1; i < lines.size(); ++i) {
    const Line& line = lines[i];
    auto f = split_fields(line.text, ';');
    if (f.size() != kColumns)
      fail_at(path, line.number, "expected 11 ';'-separated columns, found " + std::to_string(f.size()));
    s.time_s.push_back(number_at(path, line, f[0], "Timestamp"));
    s.capacity.push_back(clamp_capacity(1.0 - number_at(path, line, f[4], "CPU usage [%]") / 100.0));
    double mem_cap = optional_number_at(path, line, f[5], "Memory capacity provisioned");
    double mem_used = optional_number_at(path, line, f[6], "Memory usage");
    s.exo[0].push_back(mem_cap > 0 ? mem_used / mem_cap : kNaN);
    for (size_t k = 0; k < 4; ++k)
      s.exo[1 + k].push_back(optional_number_at(path, line, f[7 + k], "throughput"));
  }
  if (s.capacity.empty()) fail_at(path, lines[0].number, "bitbrains file has a header but no rows");
  sort_and_rebase(s);
  return {std::move(s)};
}

std::vector<TraceSeries> read_alibaba(const std::string& path, const std::vector<Line>& lines) {
  std::map<std::string, TraceSeries> by_machine;  // sorted by machine id
  for (const Line& line : lines) {
    auto f = split_fields(line.text, ',');
    if (f.size() != 9)
      fail_at(path, line.number,
              "alibaba machine_usage rows have 9 columns, found " + std::to_string(f.size()));
    std::string machine(f[0]);
    auto it = by_machine.find(machine);
    if (it == by_machine.end())
      it = by_machine
               .emplace(machine, make_series(path + "#" + machine, "alibaba",
                                             {"mem_util_pct", "net_in", "net_out", "disk_io_pct"}))
               .first;
    TraceSeries& s = it->second;
    s.time_s.push_back(number_at(path, line, f[1], "time_stamp"));
    s.capacity.push_back(clamp_capacity(1.0 - number_at(path, line, f[2], "cpu_util_percent") / 100.0));
    s.exo[0].push_back(optional_number_at(path, line, f[3], "mem_util_percent"));
    s.exo[1].push_back(optional_number_at(path, line, f[6], "net_in"));
    s.exo[2].push_back(optional_number_at(path, line, f[7], "net_out"));
    s.exo[3].push_back(optional_number_at(path, line, f[8], "disk_io_percent"));
  }
  std::vector<TraceSeries> out;
  for (auto& [machine, s] : by_machine) {
    sort_and_rebase(s);
    out.push_back(std::move(s));
  }
  return out;
}

int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {  // Howard Hinnant's algorithm
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

// "YYYY-MM-DD HH:MM:SS[.fff]" (UTC) to seconds since the epoch.
double parse_datetime(const std::string& path, const Line& line, std::string_view text) {
  int y, mo, d, h, mi;
  double sec;
  std::string s(text);
  char tail = 0;
  if (std::sscanf(s.c_str(), "%d-%d-%d%*[ T]%d:%d:%lf%c", &y, &mo, &d, &h, &mi, &sec, &tail) != 6 || mo < 1 ||
      mo > 12 || d < 1 || d > 31 || h > 24 || mi > 59 || sec < 0 || sec >= 61)
    fail_at(path, line.number, "bad starttime '" + s + "' (expected YYYY-MM-DD HH:MM:SS)");
  return static_cast<double>(days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d))) *
             86400.0 +
         h * 3600.0 + mi * 60.0 + sec;
}

std::vector<TraceSeries> read_azure(const std::string& path, const std::vector<Line>& lines) {
  std::map<std::string, TraceSeries> by_vm;
  std::map<std::string, size_t> vm_order;  // first appearance, to name pooled series stably
  for (size_t i = 1; i < lines.size(); ++i) {
    const Line& line = lines[i];
    auto f = split_fields(line.text, ',');
    if (f.size() != 4) fail_at(path, line.number, "expected 4 columns (value,runtime,starttime,VM_id)");
    std::string vm(f[3]);
    if (vm.empty()) fail_at(path, line.number, "empty VM_id");
    auto it = by_vm.find(vm);
    if (it == by_vm.end())
      it = by_vm.emplace(vm, make_series(path + "#vm" + vm, "azure", {"runtime_s"})).first;
    TraceSeries& s = it->second;
    s.time_s.push_back(parse_datetime(path, line, f[2]));
    s.capacity.push_back(number_at(path, line, f[0], "value"));  // raw throughput, normalised below
    s.exo[0].push_back(optional_number_at(path, line, f[1], "runtime"));
  }
  if (by_vm.empty()) fail_at(path, lines[0].number, "azure file has a header but no rows");
  bool each_vm_once =
      std::all_of(by_vm.begin(), by_vm.end(), [](auto& kv) { return kv.second.capacity.size() == 1; });
  std::vector<TraceSeries> series;
  if (each_vm_once && by_vm.size() > 1) {
    TraceSeries pooled = make_series(path + "#all_vms", "azure", {"runtime_s"});
    for (auto& [vm, s] : by_vm) {
      pooled.time_s.push_back(s.time_s[0]);
      pooled.capacity.push_back(s.capacity[0]);
      pooled.exo[0].push_back(s.exo[0][0]);
    }
    series.push_back(std::move(pooled));
  } else {
    // Numeric VM ids sort numerically ("2" before "10").
    std::vector<std::pair<std::string, TraceSeries*>> ordered;
    for (auto& [vm, s] : by_vm) ordered.emplace_back(vm, &s);
    std::stable_sort(ordered.begin(), ordered.end(), [](auto& a, auto& b) {
      return a.first.size() != b.first.size() ? a.first.size() < b.first.size() : a.first < b.first;
    });
    for (auto& [vm, s] : ordered) series.push_back(std::move(*s));
  }
  for (TraceSeries& s : series) {
    sort_and_rebase(s);
    double peak = *std::max_element(s.capacity.begin(), s.capacity.end());
    for (double& c : s.capacity) c = clamp_capacity(peak > 0 ? c / peak : 0.0);
  }
  return series;
}

std::vector<TraceSeries> read_plain_csv(const std::string& path, const std::vector<Line>& lines) {
  auto header = split_fields(lines[0].text, ',');
  if (header.size() < 2 || header[1] != "capacity")
    fail_at(path, lines[0].number, "csv header must be 'time_s,capacity[,exo...]'");
  std::vector<std::string> exo_names(header.begin() + 2, header.end());
  TraceSeries s = make_series(path, "csv", exo_names);
  for (size_t i = 1; i < lines.size(); ++i) {
    const Line& line = lines[i];
    auto f = split_fields(line.text, ',');
    if (f.size() != header.size())
      fail_at(path, line.number,
              "expected " + std::to_string(header.size()) + " columns, found " + std::to_string(f.size()));
    s.time_s.push_back(number_at(path, line, f[0], "time_s"));
    s.capacity.push_back(clamp_capacity(number_at(path, line, f[1], "capacity")));
    for (size_t k = 0; k < exo_names.size(); ++k)
      s.exo[k].push_back(optional_number_at(path, line, f[2 + k], exo_names[k].c_str()));
  }
  if (s.capacity.empty()) fail_at(path, lines[0].number, "csv file has a header but no rows");
  for (size_t t = 1; t < s.time_s.size(); ++t)
    if (s.time_s[t] < s.time_s[t - 1]) fail_at(path, lines[t + 1].number, "time_s must not decrease");
  double t0 = s.time_s[0];
  s.origin_s = t0;
  for (double& t : s.time_s) t -= t0;
  return {std::move(s)};
}

bool should_skip(const fs::path& p) {
  const std::string name = p.filename().string();
  return name == "README.md" || name == "MANIFEST.tsv";
}

}  // namespace

std::vector<TraceSeries> load_trace_file(const std::string& path) {
  const std::string text = read_maybe_gzip(path);
  const std::vector<Line> lines = split_lines(text);
  if (lines.empty()) throw std::runtime_error(path + ": empty trace file");
  std::string_view first = lines[0].text;
  double number;
  if (first.starts_with("time_s")) return read_plain_csv(path, lines);
  if (first.starts_with("Timestamp")) return read_bitbrains(path, lines);
  if (first.starts_with("value,runtime,starttime,VM_id")) return read_azure(path, lines);
  if (first.starts_with("m_") && first.find(',') != std::string_view::npos) return read_alibaba(path, lines);
  if (parse_number(first, number)) return read_planetlab(path, lines);
  fail_at(
      path, lines[0].number,
      "unrecognised trace format (expected planetlab, bitbrains, alibaba machine_usage, azure vm noise, or a "
      "'time_s,capacity[,exo...]' csv)");
}

std::vector<TraceSeries> load_traces(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw std::runtime_error(path + ": no such trace file or directory");
  if (!fs::is_directory(path, ec)) return load_trace_file(path);
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::follow_directory_symlink);
       it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_directory()) continue;
    if (should_skip(it->path())) continue;
    files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  std::vector<TraceSeries> all;
  for (const fs::path& file : files) {
    auto series = load_trace_file(file.string());
    for (auto& s : series) all.push_back(std::move(s));
  }
  if (all.empty()) throw std::runtime_error(path + ": no trace files found");
  return all;
}

}  // namespace lbbsp::runtime
