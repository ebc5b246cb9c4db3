#include "worker/comm/shm_segment.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

// Names in /dev/shm of segments created by process `pid`.
std::vector<std::string> SegmentsOf(pid_t pid) {
  std::vector<std::string> out;
  const std::string prefix = absl::StrCat("joule-", pid, "-");
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path());
  }
  return out;
}

bool Exists(const std::string& name) { return std::filesystem::exists("/dev/shm" + name); }

// Whether this process maps the (possibly unlinked) segment `name`.
bool Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm" + name) != std::string::npos) return true;
  }
  return false;
}

TEST(ShmSegmentTest, CreateAndAttachShareZeroFilledMemoryAndDestroyingRemovesTheName) {
  std::string name;
  {
    absl::StatusOr<ShmSegment> a = ShmSegment::Create(10000);
    ASSERT_TRUE(a.ok()) << a.status();
    name = a->name();
    EXPECT_EQ(name.rfind(absl::StrCat("/joule-", getpid(), "-"), 0), 0u) << name;
    EXPECT_EQ(a->bytes(), 10000u);
    EXPECT_TRUE(a->linked());
    EXPECT_TRUE(Exists(name));
    EXPECT_EQ(std::filesystem::file_size("/dev/shm" + name), 10000u);
    const auto* bytes = static_cast<const unsigned char*>(a->data());
    for (size_t i = 0; i < 10000; ++i) ASSERT_EQ(bytes[i], 0) << i;

    absl::StatusOr<ShmSegment> b = ShmSegment::Attach(name, 10000);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_FALSE(b->linked());  // only the creator removes the name
    EXPECT_NE(a->data(), b->data());
    static_cast<char*>(a->data())[9999] = 42;
    EXPECT_EQ(static_cast<char*>(b->data())[9999], 42);
  }
  EXPECT_FALSE(Exists(name));
  EXPECT_FALSE(Mapped(name));
  EXPECT_TRUE(SegmentsOf(getpid()).empty());
}

TEST(ShmSegmentTest, UnlinkRemovesTheNameAndKeepsTheMapping) {
  absl::StatusOr<ShmSegment> a = ShmSegment::Create(4096);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<ShmSegment> b = ShmSegment::Attach(a->name(), 4096);
  ASSERT_TRUE(b.ok()) << b.status();
  a->Unlink();
  a->Unlink();  // idempotent
  EXPECT_FALSE(a->linked());
  EXPECT_FALSE(Exists(a->name()));
  static_cast<char*>(b->data())[7] = 9;
  EXPECT_EQ(static_cast<char*>(a->data())[7], 9);
  absl::StatusOr<ShmSegment> late = ShmSegment::Attach(a->name(), 4096);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(late.status().message().rfind("shm_open " + a->name() + ": ", 0), 0u)
      << late.status();
}

TEST(ShmSegmentTest, AttachChecksTheNameAndTheSize) {
  absl::StatusOr<ShmSegment> missing = ShmSegment::Attach("/joule-1-nosuchsegment", 4096);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(missing.status().message(),
            "shm_open /joule-1-nosuchsegment: No such file or directory");
  absl::StatusOr<ShmSegment> a = ShmSegment::Create(4096);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<ShmSegment> wrong = ShmSegment::Attach(a->name(), 8192);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(wrong.status().message(), a->name() + " holds 4096 bytes, expected 8192");
}

TEST(ShmSegmentTest, ASegmentTooBigForDevShmIsAClearErrorAndLeavesNothing) {
  absl::StatusOr<ShmSegment> huge = ShmSegment::Create(size_t{1} << 50);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kUnavailable);
  const std::string m(huge.status().message());
  EXPECT_EQ(m.rfind("reserving 1125899906842624 bytes for /joule-", 0), 0u) << m;
  EXPECT_NE(m.find("MiB free)"), std::string::npos) << m;
  EXPECT_TRUE(SegmentsOf(getpid()).empty());
}

TEST(ShmSegmentTest, MovesTransferOwnershipOfTheNameAndTheMapping) {
  absl::StatusOr<ShmSegment> a = ShmSegment::Create(4096);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string name = a->name();
  ShmSegment b = *std::move(a);
  {
    ShmSegment moved_from = std::move(b);
    EXPECT_FALSE(b.mapped());
    EXPECT_FALSE(b.linked());
    EXPECT_TRUE(moved_from.linked());
    b = std::move(moved_from);
  }  // the moved-from object removes nothing
  EXPECT_TRUE(Exists(name));
  EXPECT_TRUE(Mapped(name));
  b = ShmSegment();  // assignment releases what b held
  EXPECT_FALSE(Exists(name));
  EXPECT_FALSE(Mapped(name));
}

TEST(ShmSegmentTest, ASharedMappingLivesUntilItsLastOwnerGoes) {
  absl::StatusOr<ShmSegment> a = ShmSegment::Create(4096);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string name = a->name();
  a->Unlink();
  void* base = a->data();
  std::shared_ptr<void> one = std::move(*a).Share();
  EXPECT_EQ(one.get(), base);
  std::shared_ptr<void> two = one;
  one.reset();
  EXPECT_TRUE(Mapped(name));
  static_cast<char*>(two.get())[0] = 1;  // still mapped
  two.reset();
  EXPECT_FALSE(Mapped(name));
}

TEST(ShmSegmentTest, SweepRemovesTheSegmentOfAKilledCreatorOnly) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // creates a segment, reports its name, waits to be killed
    close(pipe_fds[0]);
    absl::StatusOr<ShmSegment> s = ShmSegment::Create(4096);
    const std::string name = s.ok() ? s->name() : "!";
    (void)!write(pipe_fds[1], name.data(), name.size());
    close(pipe_fds[1]);
    while (true) pause();
  }
  close(pipe_fds[1]);
  char buf[128] = {};
  ASSERT_GT(read(pipe_fds[0], buf, sizeof(buf) - 1), 0);
  close(pipe_fds[0]);
  const std::string dead(buf);
  ASSERT_NE(dead, "!");
  EXPECT_TRUE(Exists(dead));
  absl::StatusOr<ShmSegment> alive = ShmSegment::Create(4096);  // this live process's
  ASSERT_TRUE(alive.ok()) << alive.status();
  ShmSegment::SweepStale();
  EXPECT_TRUE(Exists(dead)) << "its creator still lives";
  kill(child, SIGKILL);  // between creating and unlinking: its destructor never runs
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(Exists(dead));
  EXPECT_GE(ShmSegment::SweepStale(), 1);
  EXPECT_FALSE(Exists(dead));
  EXPECT_TRUE(SegmentsOf(child).empty());
  EXPECT_TRUE(Exists(alive->name()));
}

// An in-memory SegmentExchange for ranks run as threads: the name and the votes live in
// one board; `fail_publish` makes rank 0's Publish fail as a broken store would.
struct Board {
  std::mutex mu;
  std::condition_variable cv;
  bool published = false;
  std::string name, error;
  std::map<int, std::string> votes;
  int world = 0;
};

class FakeExchange final : public SegmentExchange {
 public:
  FakeExchange(Board& board, int rank, bool fail_publish = false)
      : b_(board), rank_(rank), fail_publish_(fail_publish) {}
  absl::Status Publish(const std::string& name, const std::string& error) override {
    std::lock_guard<std::mutex> lock(b_.mu);
    b_.published = true;
    b_.name = name;
    b_.error = fail_publish_ ? "the store is gone" : error;
    b_.cv.notify_all();
    if (fail_publish_) return absl::UnavailableError("publish: the store is gone");
    return error.empty() ? absl::OkStatus() : absl::UnavailableError("rank 0: " + error);
  }
  absl::StatusOr<std::string> ReadName() override {
    std::unique_lock<std::mutex> lock(b_.mu);
    b_.cv.wait(lock, [&] { return b_.published; });
    if (!b_.error.empty()) return absl::UnavailableError("from rank 0: " + b_.error);
    return b_.name;
  }
  absl::Status Vote(const std::string& error) override {
    std::unique_lock<std::mutex> lock(b_.mu);
    b_.votes[rank_] = error;
    b_.cv.notify_all();
    b_.cv.wait(lock, [&] { return static_cast<int>(b_.votes.size()) == b_.world; });
    for (const auto& [r, e] : b_.votes) {
      if (!e.empty()) return absl::UnavailableError(absl::StrCat("rank ", r, ": ", e));
    }
    return absl::OkStatus();
  }

 private:
  Board& b_;
  int rank_;
  bool fail_publish_;
};

// Establish on `world` ranks as threads; rank `bad` (if any) rejects the segment.
std::vector<absl::StatusOr<ShmSegment>> EstablishOn(int world, size_t bytes, int bad = -1,
                                                     bool fail_publish = false) {
  Board board;
  board.world = world;
  std::vector<absl::StatusOr<ShmSegment>> out;
  for (int r = 0; r < world; ++r) out.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      FakeExchange exchange(board, r, fail_publish && r == 0);
      ShmSegment::Hooks hooks;
      hooks.init = [](ShmSegment& s) { static_cast<char*>(s.data())[0] = 'J'; };
      hooks.check = [&](ShmSegment& s) -> std::string {
        if (static_cast<char*>(s.data())[0] != 'J') return "not initialised";
        return r == bad ? "rejected" : "";
      };
      out[r] = ShmSegment::Establish(r, bytes, exchange, hooks);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(ShmSegmentTest, EstablishGivesEveryRankTheSameMemoryAndLeavesNothingInDevShm) {
  std::vector<absl::StatusOr<ShmSegment>> s = EstablishOn(3, 8192);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(s[r].ok()) << r << ": " << s[r].status();
  EXPECT_EQ(s[1]->name(), s[0]->name());
  EXPECT_FALSE(Exists(s[0]->name())) << "unlinked after the vote";
  EXPECT_FALSE(s[0]->linked());
  static_cast<char*>(s[2]->data())[100] = 5;
  EXPECT_EQ(static_cast<char*>(s[0]->data())[100], 5);
  EXPECT_EQ(static_cast<char*>(s[1]->data())[0], 'J');  // rank 0's init came first
}

TEST(ShmSegmentTest, ARankThatCannotUseTheSegmentFailsEveryRank) {
  std::vector<absl::StatusOr<ShmSegment>> s = EstablishOn(3, 8192, /*bad=*/2);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(s[r].status().code(), absl::StatusCode::kUnavailable) << r;
    EXPECT_EQ(s[r].status().message(), "rank 2: rejected") << r;
  }
  EXPECT_TRUE(SegmentsOf(getpid()).empty());
}

TEST(ShmSegmentTest, ACreatorThatCannotCreateTellsTheOthersWhy) {
  std::vector<absl::StatusOr<ShmSegment>> s = EstablishOn(2, size_t{1} << 50);
  EXPECT_EQ(s[0].status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s[0].status().message().find("rank 0: reserving"), std::string::npos)
      << s[0].status();
  EXPECT_NE(s[1].status().message().find("from rank 0: reserving"), std::string::npos)
      << s[1].status();
  EXPECT_TRUE(SegmentsOf(getpid()).empty());
}

TEST(ShmSegmentTest, AFailedPublishUnlinksTheNewSegment) {
  std::vector<absl::StatusOr<ShmSegment>> s = EstablishOn(2, 8192, -1, /*fail_publish=*/true);
  EXPECT_EQ(s[0].status().message(), "publish: the store is gone");
  EXPECT_EQ(s[1].status().message(), "from rank 0: the store is gone");
  EXPECT_TRUE(SegmentsOf(getpid()).empty());
  // Nothing of it is mapped either.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    EXPECT_EQ(line.find(absl::StrCat("/dev/shm/joule-", getpid(), "-")), std::string::npos)
        << line;
  }
}

}  // namespace
}  // namespace joule::worker
