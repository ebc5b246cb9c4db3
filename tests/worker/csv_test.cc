#include "worker/data/csv.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace joule::worker {
namespace {

class CsvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("joule-csv-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& text) {
    const std::string path = (dir_ / absl::StrCat("t", n_++, ".csv")).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::filesystem::path dir_;
  int n_ = 0;
};

TEST_F(CsvTest, HeaderNamesTheLabelColumnAndEveryTenthRowIsTest) {
  std::string text = "x1,label,\"x 2\"\n";
  for (int r = 0; r < 25; ++r) {
    text += std::to_string(r) + "," + std::to_string(r % 3) + "," + std::to_string(r * 0.5) + "\n";
  }
  auto d = LoadCsvDataset(Write(text), 0, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  const auto& [train, test] = *d;
  EXPECT_EQ(train.size, 23);
  EXPECT_EQ(test.size, 2);  // rows 9 and 19
  EXPECT_EQ(train.width, 2);
  EXPECT_EQ(train.height, 1);
  EXPECT_EQ(train.classes, 3);
  EXPECT_EQ(test.images, (std::vector<float>{9, 4.5f, 19, 9.5f}));
  EXPECT_EQ(test.labels, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(train.images[2], 1.0f);  // row 1, first feature
  EXPECT_EQ(train.labels[1], 1);
}

TEST_F(CsvTest, WithoutAHeaderTheLabelIsTheLastColumn) {
  auto d = LoadCsvDataset(Write("0.5,1.5,1\r\n2,3,0\r\n\r\n4,5,1"), 0, 0);  // CRLF, blank, no final newline
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->first.size, 3);
  EXPECT_EQ(d->first.labels, (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(d->first.images, (std::vector<float>{0.5f, 1.5f, 2, 3, 4, 5}));
  EXPECT_EQ(d->first.classes, 2);
}

TEST_F(CsvTest, BadTablesFailNamingTheLine) {
  struct Case {
    std::string text;
    absl::StatusCode code;
    std::string mention;
  };
  const std::vector<Case> cases = {
      {"1,2,0\n3,4\n", absl::StatusCode::kDataLoss, ":2: 2 fields"},
      {"1,2,0\n3,x,1\n", absl::StatusCode::kDataLoss, ":2: column 2"},
      {"1,2,0\n3,4,-1\n", absl::StatusCode::kDataLoss, "label -1"},
      {"1,2,0\n3,4,1.5\n", absl::StatusCode::kDataLoss, "label 1.5"},
      {"1,2,0\n3,nan,1\n", absl::StatusCode::kDataLoss, "not a finite number"},
      {"1,2,0\n\"3,4,1\n", absl::StatusCode::kDataLoss, "malformed CSV"},
      {"a,b\n1,0\n", absl::StatusCode::kInvalidArgument, "1 data rows"},
      {"0\n1\n2\n", absl::StatusCode::kInvalidArgument, "feature column"},
      {"", absl::StatusCode::kInvalidArgument, ""},
  };
  for (const auto& c : cases) {
    auto d = LoadCsvDataset(Write(c.text), 0, 0);
    EXPECT_EQ(d.status().code(), c.code) << c.text << " -> " << d.status();
    EXPECT_NE(std::string(d.status().message()).find(c.mention), std::string::npos)
        << c.text << " -> " << d.status();
  }
  EXPECT_EQ(LoadCsvDataset((dir_ / "none.csv").string(), 0, 0).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CsvTest, ErrorsQuotingCellsAreValidUtf8WhateverTheCellHolds) {
  // A cell that is not UTF-8, one cut inside a character where the message would quote
  // 40 bytes, control characters: the error must still travel in a protobuf string.
  const std::string cut = std::string(39, 'x') + "\xC3\xA9yyyy";  // 'é' across byte 40
  for (const std::string& cell : {std::string("\xFF\xFE"), cut, std::string("a\x01\x7F"),
                                  std::string("\xED\xA0\x80"), std::string(5000, '\x80')}) {
    for (const std::string& text : {"1,0\n" + cell + ",1\n", "1,0\n2," + cell + "\n"}) {
      auto d = LoadCsvDataset(Write(text), 0, 0);
      ASSERT_FALSE(d.ok());
      const std::string message(d.status().message());
      EXPECT_TRUE(IsValidUtf8(message)) << testing::PrintToString(message);
      EXPECT_EQ(message.find('\n'), std::string::npos);
      EXPECT_LT(message.size(), 400u);
    }
  }
}

TEST_F(CsvTest, LimitsBoundWhatIsRead) {
  CsvLimits limits;
  limits.max_rows = 3;
  auto d = LoadCsvDataset(Write("1,0\n2,1\n3,0\n4,1\n"), 0, 0, limits);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  limits = CsvLimits{};
  limits.max_classes = 5;
  d = LoadCsvDataset(Write("1,0\n2,7\n"), 0, 0, limits);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  d = LoadCsvDataset(Write("1,0\n2,1\n3,0\n4,1\n"), 2, 0);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->first.size, 2);
}

}  // namespace
}  // namespace joule::worker
