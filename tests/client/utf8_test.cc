#include "client/utf8.h"

#include <gtest/gtest.h>

#include "joule/v1/job.pb.h"

namespace joule::client {
namespace {

TEST(Utf8Test, AcceptsWellFormedText) {
  for (const std::string s :
       {"", "plain ascii", "caf\xc3\xa9", "\xe2\x82\xac 5", "\xf0\x9f\x98\x80", "\xed\x9f\xbf",
        "\xf4\x8f\xbf\xbf", "\xee\x80\x80"}) {
    EXPECT_EQ(FirstInvalidUtf8Byte(s), std::nullopt) << s;
    EXPECT_TRUE(CheckUtf8(s, "--name").ok());
  }
}

// The class of ill-formed sequences in the Unicode Standard's table 3-7, each
// at a known offset: the lead byte of the bad sequence is reported.
TEST(Utf8Test, FindsEachKindOfIllFormedSequence) {
  struct Case {
    std::string s;
    size_t at;
  };
  const std::vector<Case> cases = {
      {"ab\xff", 2},            // never in UTF-8
      {"a\x80", 1},             // a lone continuation byte
      {"\xc0\xaf", 0},          // overlong two-byte form of '/'
      {"\xc1\xbf", 0},          // overlong
      {"x\xe0\x80\xaf", 1},     // overlong three-byte form
      {"\xed\xa0\x80", 0},      // a surrogate (U+D800)
      {"\xf0\x80\x80\xaf", 0},  // overlong four-byte form
      {"\xf4\x90\x80\x80", 0},  // above U+10FFFF
      {"\xf5\x80\x80\x80", 0},  // lead byte past F4
      {"ok\xc3", 2},            // cut short at the end
      {"ok\xe2\x82", 2},        // cut short at the end
      {"\xc3(", 0},             // a continuation that is not one
      {"\xe2\x28\xa1", 0},
      {"\xc3\xa9\xe2\x82\xac\xff", 5},  // after valid multi-byte characters
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FirstInvalidUtf8Byte(c.s), c.at) << testing::PrintToString(c.s);
  }
  absl::Status s = CheckUtf8("ab\xff", "--name");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--name: not valid UTF-8 (byte 2 is 0xFF)");
}

TEST(Utf8Test, FieldsAreNamedByTheirPath) {
  v1::JobSpec spec;
  spec.set_name("fine");
  spec.set_model("mlp");
  EXPECT_TRUE(CheckUtf8Fields(spec, "").ok());

  v1::JobSpec bad_dataset = spec;
  bad_dataset.set_dataset("csv:/data/\xff.csv");
  EXPECT_EQ(CheckUtf8Fields(bad_dataset, "job spec field ").message(),
            "job spec field dataset: not valid UTF-8 (byte 10 is 0xFF)");

  v1::JobSpec bad_label = spec;
  (*bad_label.mutable_labels())["team"] = "x\xc0";
  EXPECT_EQ(CheckUtf8Fields(bad_label, "").message(),
            "labels[\"team\"]: not valid UTF-8 (byte 1 is 0xC0)");

  v1::JobSpec bad_key = spec;
  (*bad_key.mutable_labels())["t\xfe"] = "x";
  EXPECT_EQ(CheckUtf8Fields(bad_key, "").message(),
            "a key of labels: not valid UTF-8 (byte 1 is 0xFE)");

  v1::JobSpec bad_nested = spec;
  bad_nested.mutable_optimizer()->set_name("sg\xe0");
  EXPECT_EQ(CheckUtf8Fields(bad_nested, "").message(),
            "optimizer.name: not valid UTF-8 (byte 2 is 0xE0)");
}

}  // namespace
}  // namespace joule::client
