#include "worker/comm/half.h"

#include <gtest/gtest.h>

#include <gloo/types.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace joule::worker {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(HalfTest, RoundsToNearestWithTiesToEven) {
  // Around 1.0 halves are 2^-10 apart; 2^-11 is the tie.
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3C00);  // tie, to the even 1.0
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie, to the even 1 + 2^-9
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3C01);  // past the tie
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + 0x1p-11f, 0.0f)), 0x3C00);  // short of it
  EXPECT_EQ(FloatToHalf(-1.0f - 0x1p-11f), 0xBC00);
  // A carry out of the mantissa into the exponent: just below 2 rounds to 2.
  EXPECT_EQ(FloatToHalf(2.0f - 0x1p-12f), 0x4000);
  EXPECT_EQ(FloatToHalf(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(RoundToHalf(1.0f / 3.0f), 0.333251953125f);
}

TEST(HalfTest, SubnormalsAndZeros) {
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);  // the smallest normal half
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(FloatToHalf(0x1p-15f), 0x0200);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);   // tie between 0 and 2^-24: to the even 0
  EXPECT_EQ(FloatToHalf(0x1.8p-25f), 0x0001);  // past the tie
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);  // tie between 1 and 2 ulps: to 2
  EXPECT_EQ(FloatToHalf(-0x1p-24f), 0x8001);
  EXPECT_EQ(FloatToHalf(0x1p-30f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0x1p-30f), 0x8000);  // the sign survives underflow
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03FF), 0x3FFp-24f);  // the largest subnormal
  EXPECT_EQ(HalfToFloat(0x8200), -0x1p-15f);
  EXPECT_EQ(Bits(HalfToFloat(0x8000)), 0x80000000u);
}

TEST(HalfTest, InfinitiesNansAndOverflow) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);                          // the largest half
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7BFF);    // below the midpoint
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);                          // the midpoint: to inf
  EXPECT_EQ(FloatToHalf(1e9f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-1e9f), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(FloatToHalf(FromBits(0x7F800001u)), 0x7FFF);  // signalling
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bits(HalfToFloat(0x7E00)), 0x7FFFFFFFu);
  EXPECT_EQ(Bits(HalfToFloat(0xFC01)), 0x7FFFFFFFu);
}

TEST(HalfTest, EveryHalfSurvivesTheRoundTripAndMatchesGloo) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = HalfToFloat(static_cast<Half>(h));
    gloo::float16 g;
    g.x = static_cast<uint16_t>(h);
    ASSERT_EQ(Bits(f), Bits(gloo::cpu_half2float(g))) << std::hex << h;
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    ASSERT_EQ(FloatToHalf(f), nan ? 0x7FFF : h) << std::hex << h;
  }
}

TEST(HalfTest, FloatToHalfMatchesGlooOverEveryExponent) {
  // Every sign and exponent, with the low mantissa bits that decide rounding at each
  // shift (exact ties, one either side) and random mantissas.
  std::mt19937 rng(7);
  auto check = [](uint32_t u) {
    ASSERT_EQ(FloatToHalf(FromBits(u)), gloo::cpu_float2half_rn(FromBits(u)).x)
        << std::hex << u;
  };
  for (uint32_t top = 0; top < 512; ++top) {  // sign and exponent
    const uint32_t base = top << 23;
    for (uint32_t shift = 13; shift <= 24; ++shift) {
      const uint32_t tie = 1u << (shift - 1);
      for (uint32_t high : {0u, 1u << shift, 0x7FFFFFu & ~((1u << shift) - 1)}) {
        for (uint32_t low : {0u, 1u, tie - 1, tie, tie + 1, (1u << shift) - 1}) {
          check(base | ((high | low) & 0x7FFFFFu));
        }
      }
    }
    for (int i = 0; i < 20000; ++i) check(base | (rng() & 0x7FFFFFu));
  }
}

TEST(HalfTest, Fp16WireValueDividesBeforeRounding) {
  // 20000 x 4 overflows a half; a quarter of it does not.
  EXPECT_EQ(HalfToFloat(Fp16WireValue(20000.0f, 0.25f)), 5000.0f);
  EXPECT_EQ(Fp16WireValue(1.0f / 3.0f, 1.0f), 0x3555);
  // Rounded to half before the scale (70000 is already infinite then), and after it.
  EXPECT_EQ(Fp16WireValue(70000.0f, 0.25f), 0x7C00);
  EXPECT_EQ(Fp16WireValue(1.0f, 1.0f / 3.0f), 0x3555);
}

}  // namespace
}  // namespace joule::worker
