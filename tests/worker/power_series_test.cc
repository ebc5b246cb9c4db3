#include "worker/energy/power_series.h"

#include <gtest/gtest.h>

#include <limits>

namespace joule::worker {
namespace {

TEST(PowerSeriesTest, EachPointHoldsTheAveragePowerOfItsInterval) {
  PowerSeries s(8);
  s.Add(1, 10);
  s.Add(3, 50);
  s.Add(4, 50);
  const auto p = s.samples();
  ASSERT_EQ(p.size(), 3u);
  EXPECT_DOUBLE_EQ(p[0].watts(), 10);  // since 0 s, 0 J
  EXPECT_DOUBLE_EQ(p[1].watts(), 20);
  EXPECT_DOUBLE_EQ(p[2].watts(), 0);
  EXPECT_DOUBLE_EQ(p[2].joules(), 50);
}

TEST(PowerSeriesTest, StaysBoundedSpansTheWholeAttemptAndKeepsTheEnergy) {
  for (size_t capacity : {4u, 5u, 8u, 64u, 512u}) {
    PowerSeries s(capacity);
    double joules = 0;
    for (int i = 1; i <= 1000; ++i) {
      joules += (i % 7) * 1.5;  // uneven power
      s.Add(i * 0.5, joules);
      ASSERT_LE(s.size(), capacity);
    }
    const auto p = s.samples();
    EXPECT_DOUBLE_EQ(p.back().elapsed_seconds(), 500) << capacity;  // the newest is kept
    // The whole span stays covered, at an even resolution: the first point is near the
    // start and no interval is much longer than the others.
    ASSERT_GE(p.size(), capacity / 4) << capacity;
    const double even = 500.0 / static_cast<double>(p.size());
    EXPECT_LE(p.front().elapsed_seconds(), 2.5 * even) << capacity;
    for (size_t i = 1; i < p.size(); ++i) {
      EXPECT_LE(p[i].elapsed_seconds() - p[i - 1].elapsed_seconds(), 2.5 * even)
          << capacity << " at " << i;
    }
    EXPECT_DOUBLE_EQ(p.back().joules(), joules) << capacity;
    // The watts integrate back to the energy: nothing lost by halving the resolution.
    double integral = 0, previous = 0;
    for (const auto& x : p) {
      integral += x.watts() * (x.elapsed_seconds() - previous);
      previous = x.elapsed_seconds();
    }
    EXPECT_NEAR(integral, joules, 1e-6 * joules) << capacity;
  }
}

TEST(PowerSeriesTest, IgnoresTimeThatDoesNotAdvanceAndEnergyThatGoesBack) {
  PowerSeries s(8);
  s.Add(0, 0);    // no interval since the start
  s.Add(2, 10);
  s.Add(2, 20);   // same time
  s.Add(1, 30);   // earlier
  s.Add(3, 5);    // energy going backwards (a reset meter)
  s.Add(4, std::numeric_limits<double>::quiet_NaN());
  s.Add(std::numeric_limits<double>::quiet_NaN(), 40);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(s.samples()[0].watts(), 5);
}

}  // namespace
}  // namespace joule::worker
