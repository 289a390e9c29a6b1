// Reading utilisation/performance traces (../shared/traces formats, plus a plain CSV) into capacity series.
#pragma once
#include <string>
#include <vector>

namespace lbbsp::runtime {

struct TraceSeries {
  std::string source;                    // file path, plus "#machine" / "#vm" where a file holds several
  std::string family;                    // planetlab | bitbrains | alibaba | azure | csv
  std::vector<double> time_s;            // sample times, seconds from the series' start
  std::vector<double> capacity;          // speed signal in (0, 1]: 1 - cpu_util/100, or throughput / max
  std::vector<std::string> exo_names;    // other columns (memory %, net, ...)
  std::vector<std::vector<double>> exo;  // exo[k][t], same length as capacity
};

// A file or a directory (searched recursively); gzip or plain. Throws std::runtime_error naming the file and
// line of anything it cannot read (never skips silently).
std::vector<TraceSeries> load_traces(const std::string& path);

}  // namespace lbbsp::runtime
