#include "server/straggler.h"

#include <gtest/gtest.h>

namespace joule::server {
namespace {

RankTiming Rank(int rank, double step, double wait, std::vector<std::pair<int, double>> links = {}) {
  RankTiming t;
  t.rank = rank;
  t.host = "h" + std::to_string(rank);
  t.step_seconds = step;
  t.collective_wait_seconds = wait;
  for (const auto& [peer, mbps] : links) {
    v1::LinkThroughput l;
    l.set_peer(peer);
    l.set_megabytes_per_second(mbps);
    l.set_bytes(1 << 20);
    t.links.push_back(l);
  }
  return t;
}

// The figures: a rank on a core shared with a CPU hog computes longer and so
// waits least; the waiting rank's allreduce time is the larger (2.78 s against 1.76 s of
// wait). The hogged rank is named, as compute, with the others' extra wait.
TEST(StragglerTest, TheRankThatWaitsLeastIsNamedAndItsComputeIsTheCause) {
  const auto s = NameStraggler({Rank(0, 4.0, 2.78), Rank(1, 4.0, 1.76)});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rank(), 1);
  EXPECT_EQ(s->host(), "h1");
  EXPECT_EQ(s->cause(), "compute");
  EXPECT_NEAR(s->wait_seconds(), 1.02, 1e-9);
  EXPECT_NE(s->text().find("rank 1 (host h1)"), std::string::npos) << s->text();
  // Whatever its rank number, among several.
  const auto four = NameStraggler(
      {Rank(0, 1.0, 0.40), Rank(1, 1.0, 0.42), Rank(2, 1.0, 0.05), Rank(3, 1.0, 0.41)});
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ(four->rank(), 2);
  EXPECT_EQ(four->cause(), "compute");
}

// Ranks whose waits differ by less than a tenth of a step (or a millisecond) are noise:
// none is named; neither with one rank, nor with ranks that did not report timing or
// report an impossible one (a wait longer than the step).
TEST(StragglerTest, NoiseOneRankAndMissingOrImpossibleTimingNameNobody) {
  EXPECT_FALSE(NameStraggler({Rank(0, 1.0, 0.30), Rank(1, 1.0, 0.25)}).has_value());
  EXPECT_FALSE(NameStraggler({Rank(0, 0.0005, 0.0004), Rank(1, 0.0005, 0.0)}).has_value());
  EXPECT_FALSE(NameStraggler({Rank(0, 1.0, 0.9)}).has_value());
  EXPECT_FALSE(NameStraggler({}).has_value());
  EXPECT_FALSE(NameStraggler({Rank(0, 1.0, 0.9), Rank(1, 0, 0)}).has_value());
  EXPECT_FALSE(NameStraggler({Rank(0, 1.0, 0.9), Rank(1, 1.0, 1.5)}).has_value());
  // Just past the threshold: named.
  EXPECT_TRUE(NameStraggler({Rank(0, 1.0, 0.36), Rank(1, 1.0, 0.25)}).has_value());
}

// A rank that arrives last although its compute is no slower: "late", not "compute".
TEST(StragglerTest, ALateRankWhoseComputeIsNoSlowerIsLate) {
  // Rank 1 waits least, but its step is shorter too: its compute equals the others'.
  const auto s = NameStraggler({Rank(0, 1.0, 0.5), Rank(1, 0.6, 0.1)});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rank(), 1);
  EXPECT_EQ(s->cause(), "late");
}

// A shaped link: every rank waits alike (the same bytes), so arrival names nobody; the
// probes do. With three ranks, the one whose every link is slow is named as the link;
// with two, one link joins them and nobody is named; a compute-bound job's slow link is
// not what anyone waits on.
TEST(StragglerTest, TheRankWhoseEveryLinkIsSlowIsNamedWhenTheJobWaitsOnLinks) {
  const auto s = NameStraggler({Rank(0, 1.0, 0.50, {{1, 11.9}, {2, 118}}),
                                Rank(1, 1.0, 0.51, {{0, 11.8}, {2, 11.7}}),
                                Rank(2, 1.0, 0.50, {{0, 117}, {1, 11.9}})});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rank(), 1);
  EXPECT_EQ(s->cause(), "link");
  EXPECT_NE(s->text().find("11.8 MB/s"), std::string::npos) << s->text();  // its fastest link
  EXPECT_NE(s->text().find("117.0 MB/s"), std::string::npos) << s->text();  // pair 0-2's slower way
  // One direction slow is enough: the slower of the two counts.
  EXPECT_TRUE(NameStraggler({Rank(0, 1.0, 0.5, {{1, 118}, {2, 118}}),
                             Rank(1, 1.0, 0.5, {{0, 11.8}, {2, 11.7}}),
                             Rank(2, 1.0, 0.5, {{0, 117}, {1, 118}})})
                  .has_value());
  // Two ranks: no telling which end.
  EXPECT_FALSE(
      NameStraggler({Rank(0, 1.0, 0.5, {{1, 11.9}}), Rank(1, 1.0, 0.5, {{0, 11.8}})}).has_value());
  // Compute-bound (5% of a step at the allreduce): the link costs nothing to name.
  EXPECT_FALSE(NameStraggler({Rank(0, 1.0, 0.05, {{1, 11.9}, {2, 118}}),
                              Rank(1, 1.0, 0.05, {{0, 11.8}, {2, 11.7}}),
                              Rank(2, 1.0, 0.05, {{0, 117}, {1, 11.9}})})
                   .has_value());
  // Equal links: nobody.
  EXPECT_FALSE(NameStraggler({Rank(0, 1.0, 0.5, {{1, 100}, {2, 120}}),
                              Rank(1, 1.0, 0.5, {{0, 110}, {2, 90}}),
                              Rank(2, 1.0, 0.5, {{0, 115}, {1, 105}})})
                   .has_value());
  // A compute straggler beside slow links is named for its compute first.
  const auto both = NameStraggler({Rank(0, 1.0, 0.60, {{1, 11.9}, {2, 118}}),
                                   Rank(1, 1.0, 0.61, {{0, 11.8}, {2, 11.7}}),
                                   Rank(2, 1.0, 0.20, {{0, 117}, {1, 11.9}})});
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->rank(), 2);
  EXPECT_EQ(both->cause(), "compute");
}

}  // namespace
}  // namespace joule::server
