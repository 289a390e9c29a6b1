// Reading utilisation/performance traces (../shared/traces formats, plus a plain CSV) into capacity series.
#pragma once
#include <string>
#include <vector>

namespace lbbsp::runtime {

// Capacities are clamped into [kMinCapacity, 1] so that a fully loaded machine still makes (slow) progress.
inline constexpr double kMinCapacity = 0.02;

struct TraceSeries {
  std::string source;                    // file path, plus "#machine" / "#vm" where a file holds several
  std::string family;                    // planetlab | bitbrains | alibaba | azure | csv
  std::vector<double> time_s;            // sample times, seconds from the series' start
  double origin_s = 0;                   // the first sample's time in the file's own clock (0 for planetlab)
  std::vector<double> capacity;          // speed signal in (0, 1]: 1 - cpu_util/100, or throughput / max
  std::vector<std::string> exo_names;    // other columns (memory %, net, ...)
  std::vector<std::vector<double>> exo;  // exo[k][t], same length as capacity (NaN where the trace has a gap)
};

// A file or a directory (searched recursively, in sorted path order; README.md and MANIFEST.tsv are skipped);
// gzip or plain. Throws std::runtime_error naming the file and line of anything it cannot read (never skips
// silently).
//
// Formats, recognised from the content:
//   planetlab  one integer CPU % per line, no header; 300 s sampling.
//   bitbrains  "Timestamp [ms];\tCPU cores;..." header; capacity = 1 - CPU usage[%]/100,
//              exo = memory used/provisioned, disk read/write KB/s, net rx/tx KB/s.
//   alibaba    machine_usage rows "m_ID,time,cpu%,mem%,,,net_in,net_out,disk_io", no header; one series per
//              machine sorted by time; exo = mem %, net in, net out, disk io.
//   azure      "value,runtime,starttime,VM_id" header; one series per VM sorted by starttime, capacity =
//              value / series max; exo = runtime (s). A file whose VMs are each measured once (short-lived
//              VMs) becomes a single series of all its VMs in starttime order (host-to-host variability).
//   csv        "time_s,capacity[,exo...]" header; capacity used as is (clamped).
std::vector<TraceSeries> load_traces(const std::string& path);

// One file (any of the formats above).
std::vector<TraceSeries> load_trace_file(const std::string& path);

}  // namespace lbbsp::runtime
