// LoadClientTokens: the coordinator's table of client tokens, and every kind of
// bad file it must refuse at start rather than serve with.
#include "common/security.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <cstdlib>
#include <fstream>

namespace joule {
namespace {

namespace fs = std::filesystem;

class LoadClientTokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("joule_tokens_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& text) {
    const std::string path = (dir_ / "clients").string();
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    return path;
  }

  fs::path dir_;
};

TEST_F(LoadClientTokensTest, ReadsNamesAndTokensSkippingCommentsAndBlankLines) {
  auto tokens =
      LoadClientTokens(Write("# name token\n\nalice s3cret-alice\n  "
                             "bob\ts3cret-bob  \r\nalice rotated-alice\n"));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens,
            (std::map<std::string, std::string>{
                {"s3cret-alice", "alice"}, {"s3cret-bob", "bob"}, {"rotated-alice", "alice"}}));
}

TEST_F(LoadClientTokensTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadClientTokens((dir_ / "absent").string()).status().code(),
            absl::StatusCode::kNotFound);
}

// Each bad file is refused with one line naming the file and the line at fault
// (and, for a duplicate, the earlier line), never the token itself.
TEST_F(LoadClientTokensTest, RefusesEveryKindOfBadFileNamingTheLine) {
  struct Case {
    const char* what;
    std::string text;
    std::vector<std::string> want;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"the reserved name",
       "alice a-token\nanonymous any-token\n",
       {"line 2", "\"anonymous\" is reserved"}},
      {"a duplicate token",
       "alice same-token\n# c\nbob same-token\n",
       {"line 3", "the same token as line 1"}},
      {"a duplicate token for the same name",
       "alice t1\nalice t1\n",
       {"line 2", "the same token as line 1"}},
      {"one field", "alice a-token\nbob\n", {"line 2", "want \"NAME TOKEN\"", "found 1 field"}},
      {"three fields", "alice a-token extra\n", {"line 1", "found 3 fields"}},
      {"a trailing comment", "alice a-token # mine\n", {"line 1", "found 4 fields"}},
      {"a control byte in the token",
       std::string("alice tok\x01"
                   "en\n"),
       {"line 1", "token", "not printable ASCII at offset 3"}},
      {"a non-ASCII name",
       "b\xc3\xb6"
       "b token\n",
       {"line 1", "name", "offset 1"}},
      {"a NUL in the token",
       std::string("alice tok\0en\n", sizeof("alice tok\0en\n") - 1),
       {"line 1", "token"}},
      {"only comments", "# nobody\n\n", {"holds no \"NAME TOKEN\" line"}},
      {"an empty file", "", {"holds no \"NAME TOKEN\" line"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = Write(c.text);
    auto tokens = LoadClientTokens(path);
    ASSERT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument) << tokens.status();
    const std::string message(tokens.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const std::string& w : c.want) {
      EXPECT_NE(message.find(w), std::string::npos) << "want \"" << w << "\" in: " << message;
    }
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.find("same-token"), std::string::npos) << "a token leaked: " << message;
  }
}

// A client's own token: gRPC aborts the process on a header byte it cannot carry, so every
// such byte is refused here first, from a file or the environment.
TEST_F(LoadClientTokensTest, LoadTokenRefusesBytesNoHeaderCanCarry) {
  const std::string path = Write("  s3cret-alice \n");
  auto ok = LoadToken(path, nullptr);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "s3cret-alice");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("tok\x01" "en\n"), "byte 3 of the token is not printable ASCII (0x01)"},
      {"tok\xff" "en\n", "byte 3 of the token is not printable ASCII (0xff)"},
      {"alice s3cret-alice\n", "byte 5 of the token is not printable ASCII (0x20)"},
      {"first\nsecond\n", "byte 5 of the token is not printable ASCII (0x0a)"},
  };
  for (const auto& [text, want] : cases) {
    SCOPED_TRACE(want);
    auto token = LoadToken(Write(text), nullptr);
    ASSERT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument) << token.status();
    EXPECT_EQ(token.status().message(), "token file " + path + ": " + want);
  }
  EXPECT_EQ(LoadToken(Write(" \n"), nullptr).status().code(), absl::StatusCode::kInvalidArgument);

  setenv("JOULE_TEST_TOKEN", "t\x7f", 1);
  EXPECT_EQ(LoadToken("", "JOULE_TEST_TOKEN").status().message(),
            "$JOULE_TEST_TOKEN: byte 1 of the token is not printable ASCII (0x7f)");
  setenv("JOULE_TEST_TOKEN", " fine ", 1);
  EXPECT_EQ(*LoadToken("", "JOULE_TEST_TOKEN"), "fine");
  unsetenv("JOULE_TEST_TOKEN");
  EXPECT_EQ(*LoadToken("", "JOULE_TEST_TOKEN"), "");
}

}  // namespace
}  // namespace joule
