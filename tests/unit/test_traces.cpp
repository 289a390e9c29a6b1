// load_traces: every supported format (gzip or plain), directory walking, and errors naming file and line.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "runtime/analysis/traces.hpp"

namespace fs = std::filesystem;
using lbbsp::runtime::load_traces;
using lbbsp::runtime::TraceSeries;

namespace {

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-12) << "at " << i;
}

class TracesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lbbsp_traces_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text, bool gzip = false) {
    fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    if (gzip) {
      gzFile f = gzopen(p.c_str(), "wb");
      gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
      gzclose(f);
    } else {
      std::ofstream(p) << text;
    }
    return p.string();
  }
  static std::string error_of(const std::string& path) {
    try {
      load_traces(path);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

}  // namespace

TEST_F(TracesTest, PlanetlabIntegersPerLine) {
  auto s = load_traces(write("vm1", "10\n0\n100\n55\n"));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].family, "planetlab");
  expect_near(s[0].capacity, (std::vector<double>{0.9, 1.0, 0.02, 0.45}));  // 100 % busy clamps to 0.02
  EXPECT_EQ(s[0].time_s, (std::vector<double>{0, 300, 600, 900}));
  EXPECT_TRUE(s[0].exo.empty());
}

TEST_F(TracesTest, BitbrainsGzipSemicolonTab) {
  std::string text =
      "Timestamp [ms];\tCPU cores;\tCPU capacity provisioned [MHZ];\tCPU usage [MHZ];\tCPU usage "
      "[%];\tMemory "
      "capacity provisioned [KB];\tMemory usage [KB];\tDisk read throughput [KB/s];\tDisk write throughput "
      "[KB/s];\tNetwork received throughput [KB/s];\tNetwork transmitted throughput [KB/s]\n"
      "1000;\t2;\t5000;\t500;\t10.0;\t1000.0;\t250.0;\t1.5;\t2.5;\t3.5;\t4.5\n"
      "1300;\t2;\t5000;\t2500;\t50.0;\t1000.0;\t500.0;\t0;\t0;\t0;\t0\r\n";
  auto s = load_traces(write("2013-7/7.csv.gz", text, true));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].family, "bitbrains");
  expect_near(s[0].capacity, (std::vector<double>{0.9, 0.5}));
  EXPECT_EQ(s[0].time_s, (std::vector<double>{0, 300}));
  ASSERT_EQ(s[0].exo.size(), 5u);
  EXPECT_EQ(s[0].exo_names[0], "mem_used_frac");
  EXPECT_EQ(s[0].exo[0], (std::vector<double>{0.25, 0.5}));
  EXPECT_EQ(s[0].exo[4], (std::vector<double>{4.5, 0}));
}

TEST_F(TracesTest, AlibabaOneSeriesPerMachineSortedByTime) {
  auto s = load_traces(write("machine_usage.csv",
                             "m_2,100,40,90,,,10,11,5\n"
                             "m_1,70,20,80,,,1,2,3\n"
                             "m_2,40,60,91,,,,12,6\n"
                             "m_1,10,30,81,,,4,5,6\n"));
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].source.substr(s[0].source.size() - 4), "#m_1");
  EXPECT_EQ(s[0].family, "alibaba");
  EXPECT_EQ(s[0].time_s, (std::vector<double>{0, 60}));
  expect_near(s[0].capacity, (std::vector<double>{0.7, 0.8}));
  expect_near(s[1].capacity, (std::vector<double>{0.4, 0.6}));
  EXPECT_EQ(s[1].exo[0], (std::vector<double>{91, 90}));  // mem %, moved with its row
  EXPECT_TRUE(std::isnan(s[1].exo[1][0]));                // empty net_in: missing, not an error
}

TEST_F(TracesTest, AzurePerVmNormalisedByMaxAndShortLivedPooled) {
  auto s = load_traces(write("sysbench__long.csv.gz",
                             "value,runtime,starttime,VM_id\n"
                             "200,90.0,2023-06-01 01:00:00.000,0\n"
                             "50,90.0,2023-06-01 00:00:00.000,10\n"
                             "100,91.0,2023-06-01 00:00:00.000,0\n"
                             "100,90.5,2023-06-01 02:00:00.500,10\n",
                             true));
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].family, "azure");
  EXPECT_NE(s[0].source.find("#vm0"), std::string::npos);
  expect_near(s[0].capacity, (std::vector<double>{0.5, 1.0}));  // sorted by starttime, then / max
  EXPECT_EQ(s[0].time_s, (std::vector<double>{0, 3600}));
  EXPECT_EQ(s[0].exo[0], (std::vector<double>{91.0, 90.0}));
  EXPECT_EQ(s[1].time_s, (std::vector<double>{0, 7200.5}));
  auto pooled = load_traces(write("sysbench__short.csv",
                                  "value,runtime,starttime,VM_id\n"
                                  "80,90,2023-06-02 00:00:00,1\n"
                                  "40,90,2023-06-01 00:00:00,2\n"));
  ASSERT_EQ(pooled.size(), 1u);
  expect_near(pooled[0].capacity, (std::vector<double>{0.5, 1.0}));
  EXPECT_EQ(pooled[0].time_s, (std::vector<double>{0, 86400}));
}

TEST_F(TracesTest, PlainCsvWithExoColumns) {
  auto s = load_traces(write("mine.csv", "time_s,capacity,mem,net\n5,0.5,1,2\n6,1.5,,4\n8,0.001,3,4\n"));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].family, "csv");
  EXPECT_EQ(s[0].time_s, (std::vector<double>{0, 1, 3}));
  expect_near(s[0].capacity, (std::vector<double>{0.5, 1.0, 0.02}));  // clamped into [0.02, 1]
  EXPECT_EQ(s[0].exo_names, (std::vector<std::string>{"mem", "net"}));
  EXPECT_TRUE(std::isnan(s[0].exo[0][1]));
}

TEST_F(TracesTest, DirectoryIsWalkedRecursivelySkippingReadmeAndManifest) {
  write("README.md", "# not a trace\n");
  write("a/MANIFEST.tsv", "x\ty\n");
  write("a/b/vm", "50\n50\n");
  write("a/c.csv.gz", "time_s,capacity\n0,0.5\n", true);
  auto s = load_traces(dir_.string());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].family, "planetlab");  // sorted paths: a/b/vm before a/c.csv.gz
  EXPECT_EQ(s[1].family, "csv");
}

TEST_F(TracesTest, ErrorsNameTheFileAndLine) {
  std::string bad = write("d/vm", "10\n20\nabc\n");
  std::string e = error_of(dir_.string());
  EXPECT_NE(e.find(bad + ":3"), std::string::npos) << e;
  EXPECT_NE(e.find("abc"), std::string::npos) << e;
  fs::remove(bad);
  std::string csv = write("d/x.csv", "time_s,capacity\n0,0.5\n1,0.5,9\n");
  e = error_of(csv);
  EXPECT_NE(e.find(csv + ":3"), std::string::npos) << e;
  std::string unknown = write("d/y.txt", "hello,world\n");
  e = error_of(unknown);
  EXPECT_NE(e.find(unknown + ":1"), std::string::npos) << e;
  EXPECT_NE(e.find("unrecognised"), std::string::npos) << e;
  EXPECT_NE(error_of(write("d/empty", "")).find("empty"), std::string::npos);
  std::string azure = write("d/az.csv", "value,runtime,starttime,VM_id\n1,2,yesterday,0\n");
  EXPECT_NE(error_of(azure).find(azure + ":2"), std::string::npos);
  std::string corrupt = write("d/z.gz", std::string("\x1f\x8b\x08\x00garbage", 12));
  EXPECT_NE(error_of(corrupt).find(corrupt), std::string::npos);
  EXPECT_NE(error_of((dir_ / "missing").string()).find("missing"), std::string::npos);
}

// The real traces, when this checkout has them next to it (CI does; clones may not).
TEST(TracesShared, RealTracesLoadWhenPresent) {
  const fs::path shared = fs::path(LBBSP_SOURCE_DIR) / ".." / "shared" / "traces";
  if (!fs::exists(shared)) {
    std::printf("skipped: %s not present\n", shared.c_str());
    EXPECT_FALSE(fs::exists(shared / "README.md"));
    return;
  }
  auto all = load_traces(shared.string());
  std::map<std::string, size_t> per_family;
  for (const auto& s : all) {
    ++per_family[s.family];
    ASSERT_FALSE(s.capacity.empty()) << s.source;
    for (double c : s.capacity) ASSERT_TRUE(c >= lbbsp::runtime::kMinCapacity && c <= 1.0) << s.source;
    for (const auto& column : s.exo) ASSERT_EQ(column.size(), s.capacity.size()) << s.source;
    ASSERT_TRUE(std::is_sorted(s.time_s.begin(), s.time_s.end())) << s.source;
  }
  EXPECT_EQ(per_family["planetlab"], 300u);
  EXPECT_EQ(per_family["bitbrains"], 50u);
  EXPECT_EQ(per_family["alibaba"], 16u);
  EXPECT_EQ(per_family["azure"], 64u);  // 20 long files x 3 VMs + 4 pooled short-lived files
}
