#include "common/text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace joule {
namespace {

// Every kind of malformed UTF-8 (RFC 3629, Markus Kuhn's decoder test classes): a lone
// continuation byte, a truncated sequence, overlong forms, surrogates, code points past
// U+10FFFF, bytes that never occur.
const std::vector<std::string>& Malformed() {
  static const std::vector<std::string> k = {
      "\x80",             "\xBF",         "\xC3",          "\xE2\x82",    "\xF0\x9F\x98",
      "\xC0\xAF",         "\xC1\xBF",     "\xE0\x80\xAF",  "\xF0\x80\x80\xAF",
      "\xED\xA0\x80",     "\xED\xBF\xBF", "\xF4\x90\x80\x80", "\xF5\x80\x80\x80",
      "\xFE",             "\xFF",         "\xC3\x28",      "\xE2\x28\xA1"};
  return k;
}

TEST(TextTest, AcceptsValidUtf8OfEveryLength) {
  for (const std::string s : {"", "plain", "caf\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80",
                              "\xF4\x8F\xBF\xBF", "\xED\x9F\xBF", "\xEE\x80\x80"}) {
    EXPECT_TRUE(IsValidUtf8(s)) << s;
    EXPECT_EQ(SanitizeUtf8(s), s);
  }
}

TEST(TextTest, FindsTheFirstInvalidByteOfEveryMalformedClass) {
  for (const std::string& bad : Malformed()) {
    const std::string s = "ok " + bad + " tail";
    EXPECT_EQ(FirstInvalidUtf8(s), 3u) << testing::PrintToString(bad);
  }
}

TEST(TextTest, SanitizedTextIsAlwaysValidAndOneLine) {
  for (const std::string& bad : Malformed()) {
    for (size_t max : {3u, 4u, 5u, 7u, 16u, 1024u}) {
      const std::string in = "cell \xC3\xA9 " + bad + "\n\t\x01 end";
      const std::string out = SanitizeUtf8(in, max);
      EXPECT_TRUE(IsValidUtf8(out)) << testing::PrintToString(out);
      EXPECT_LE(out.size(), max);
      EXPECT_EQ(out.find('\n'), std::string::npos);
      EXPECT_EQ(out.find('\t'), std::string::npos);
    }
  }
  EXPECT_EQ(SanitizeUtf8("a\xFF" "b\n"), "a\\xFFb\\x0A");
}

TEST(TextTest, CutsOnCharacterAndEscapeBoundaries) {
  // Each prefix length of a string of 2-, 3- and 4-byte characters and escapes: the
  // result never ends inside a character or an escape.
  const std::string in = "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xFF\xC3\xA9xyz";
  for (size_t max = 3; max <= in.size() + 8; ++max) {
    const std::string out = SanitizeUtf8(in, max);
    EXPECT_TRUE(IsValidUtf8(out)) << max;
    EXPECT_LE(out.size(), max);
    if (out.size() >= 3 && out.compare(out.size() - 3, 3, "...") == 0) {
      const std::string body = out.substr(0, out.size() - 3);
      const std::string full = SanitizeUtf8(in, 1 << 20);
      EXPECT_EQ(full.compare(0, body.size(), body), 0) << max;  // a prefix, cut cleanly
      EXPECT_TRUE(body.empty() || body.back() != '\\') << max;
    } else {
      EXPECT_EQ(out, SanitizeUtf8(in, 1 << 20)) << max;
    }
  }
}

TEST(TextTest, TextThatFitsIsNeverCut) {
  EXPECT_EQ(SanitizeUtf8("abcdefghij", 10), "abcdefghij");
  EXPECT_EQ(SanitizeUtf8("abc", 3), "abc");
  EXPECT_EQ(SanitizeUtf8("abcd", 3), "...");
  EXPECT_EQ(SanitizeUtf8("abcdefghijk", 10), "abcdefg...");
  EXPECT_EQ(SanitizeUtf8("\xC3\xA9\xC3\xA9", 4), "\xC3\xA9\xC3\xA9");
}

TEST(TextTest, EscapesWhatCouldBreakOrSpoofALine) {
  EXPECT_EQ(SanitizeUtf8("a\\x41"), "a\\\\x41");  // a backslash cannot pass for an escape
  EXPECT_EQ(SanitizeUtf8("x\xE2\x80\xAEy"), "x\\u202Ey");  // RIGHT-TO-LEFT OVERRIDE
  EXPECT_EQ(SanitizeUtf8("x\xC2\x85y"), "x\\u0085y");      // NEXT LINE (C1)
  EXPECT_EQ(SanitizeUtf8("x\xE2\x80\xA8y"), "x\\u2028y");  // LINE SEPARATOR
  for (const char* bad : {"\xE2\x80\xAE", "\xC2\x85", "\xE2\x80\xA9", "\xE2\x81\xA6"}) {
    EXPECT_EQ(CheckText("name", std::string("a") + bad, 64).message(),
              "name holds a control character at byte 1");
  }
}

TEST(TextTest, CheckTextNamesTheFieldAndTheProblem) {
  EXPECT_TRUE(CheckText("name", "r\xC3\xA9sum\xC3\xA9", 16).ok());
  absl::Status s = CheckText("name", std::string(20, 'x'), 16);
  EXPECT_EQ(s.message(), "name is 20 bytes, more than 16");
  s = CheckText("labels[\"team\"]", "ab\xFF", 16);
  EXPECT_EQ(s.message(), "labels[\"team\"] is not valid UTF-8 at byte 2");
  s = CheckText("host", "a\nb", 16);
  EXPECT_EQ(s.message(), "host holds a control character at byte 1");
  for (const std::string& bad : Malformed()) {
    EXPECT_EQ(CheckText("f", bad, 64).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(ParseEnergyTest, ReadsJoulesAndWattHoursWithSiPrefixes) {
  const std::pair<const char*, double> cases[] = {
      {"50000", 50000},  {"50kJ", 50000},  {"50 kJ", 50000}, {" 1.5MJ ", 1.5e6},
      {"2GJ", 2e9},      {"12Wh", 43200},  {"0.5kWh", 1.8e6}, {"1MWh", 3.6e9},
      {"0", 0},          {"7J", 7},        {"1e3J", 1000}};
  for (const auto& [text, joules] : cases) {
    absl::StatusOr<double> j = ParseEnergy(text);
    ASSERT_TRUE(j.ok()) << text << ": " << j.status();
    EXPECT_DOUBLE_EQ(*j, joules) << text;
  }
}

TEST(ParseEnergyTest, RefusesEveryOtherFormWithOneLineNamingIt) {
  for (const char* bad : {"", "kJ", "-5kJ", "5 kj", "5 KJ", "5W", "5 joules", "nan", "inf",
                          "5kJ5", "5 k J", "0x10", "\xff\xfekJ", "5\nkJ", "5mJ"}) {
    absl::StatusOr<double> j = ParseEnergy(bad);
    ASSERT_FALSE(j.ok()) << bad << " gave " << *j;
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string m(j.status().message());
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_TRUE(IsValidUtf8(m)) << m;
  }
}

// Issue 23: numbers a double cannot hold say so (not "no budget" for an underflow to 0).
TEST(ParseEnergyTest, NumbersBeyondADoubleAreOutOfRange) {
  for (const char* big : {"1e400", "1e400kJ", "1e308MWh", "9e307GJ"}) {
    absl::StatusOr<double> j = ParseEnergy(big);
    ASSERT_FALSE(j.ok()) << big << " gave " << *j;
    EXPECT_EQ(j.status().code(), absl::StatusCode::kOutOfRange) << big << ": " << j.status();
    EXPECT_NE(j.status().message().find("too large"), std::string::npos) << j.status();
  }
  for (const char* tiny : {"1e-400J", "0.5e-330", "3e-400kWh"}) {
    absl::StatusOr<double> j = ParseEnergy(tiny);
    ASSERT_FALSE(j.ok()) << tiny << " gave " << *j;
    EXPECT_EQ(j.status().code(), absl::StatusCode::kOutOfRange) << tiny << ": " << j.status();
    EXPECT_NE(j.status().message().find("too small"), std::string::npos) << j.status();
  }
  for (const char* zero : {"0", "0.0J", "0e-400", "0e400kJ"}) {
    absl::StatusOr<double> j = ParseEnergy(zero);
    ASSERT_TRUE(j.ok()) << zero << ": " << j.status();
    EXPECT_EQ(*j, 0) << zero;
  }
}

TEST(ParseEnergyTest, ABudgetIsAboveZeroOrNone) {
  EXPECT_DOUBLE_EQ(*ParseEnergyBudget("30J"), 30);
  EXPECT_DOUBLE_EQ(*ParseEnergyBudget("1e-300J"), 1e-300);
  EXPECT_EQ(*ParseEnergyBudget("none"), 0);
  for (const char* zero : {"0", "0J", "0.0kWh"}) {
    absl::StatusOr<double> j = ParseEnergyBudget(zero);
    ASSERT_FALSE(j.ok()) << zero;
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(j.status().message().find("\"none\" for no budget"), std::string::npos) << j.status();
  }
  EXPECT_EQ(ParseEnergyBudget("1e-400J").status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ParseEnergyBudget("1e400kJ").status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ParseEnergyBudget("-3J").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace joule
