#include "worker/comm/half.h"

#include <gtest/gtest.h>

#include <gloo/types.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

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

// Floats that exercise every conversion path: every half's value (so every exponent,
// subnormals, infinities), ties and their neighbours, overflow, signed zeros, float
// subnormals, NaNs (quiet, signalling, negative) and random bit patterns.
std::vector<float> TrickyFloats() {
  std::vector<float> v;
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = HalfToFloat(static_cast<Half>(h));
    v.push_back(f);
    v.push_back(std::nextafter(f, 0.0f));
    v.push_back(std::nextafter(f, std::numeric_limits<float>::infinity()));
  }
  for (float f : {0x1p-25f, 0x1.8p-25f, 3 * 0x1p-25f, 65520.0f, std::nextafter(65520.0f, 0.0f),
                  1e9f, -1e9f, FromBits(0x00000001u), FromBits(0x807FFFFFu),
                  FromBits(0x7F800001u), FromBits(0xFFC00000u), FromBits(0x7FC00001u),
                  -0.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f}) {
    v.push_back(f);
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) v.push_back(FromBits(static_cast<uint32_t>(rng())));
  return v;
}

std::vector<Half> EveryHalfTwice() {
  std::vector<Half> v;
  for (uint32_t h = 0; h <= 0xFFFF; ++h) v.push_back(static_cast<Half>(h));
  std::mt19937 rng(13);
  for (uint32_t h = 0; h <= 0xFFFF; ++h) v.push_back(static_cast<Half>(rng()));
  return v;
}

// The bulk forms against the scalar ones, bit for bit, at every offset of an 8-wide
// vector (unaligned starts) and with tails of every length.
TEST(HalfBulkTest, EveryBulkFormMatchesItsScalarFunction) {
  std::printf("vectorised (F16C): %s\n", HalfConversionsVectorised() ? "yes" : "no");
  const std::vector<float> floats = TrickyFloats();
  const std::vector<Half> halves = EveryHalfTwice();
  for (size_t start : {0u, 1u, 3u, 7u}) {
    for (size_t cut : {0u, 1u, 5u}) {
      const size_t n = floats.size() - start - cut;
      const float* in = floats.data() + start;
      std::vector<Half> out(n);
      FloatsToHalves(in, out.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], FloatToHalf(in[i])) << std::hex << Bits(in[i]);
      }
      for (float scale : {1.0f, 0.5f, 1.0f / 3.0f}) {
        ToFp16Wire(in, scale, out.data(), n);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(out[i], Fp16WireValue(in[i], scale)) << std::hex << Bits(in[i]) << " " << scale;
        }
      }
      std::vector<float> rounded(in, in + n);
      RoundToHalves(rounded.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(Bits(rounded[i]), Bits(RoundToHalf(in[i]))) << std::hex << Bits(in[i]);
      }

      const size_t m = halves.size() / 2 - start - cut;
      const Half* a = halves.data() + start;
      const Half* b = halves.data() + halves.size() / 2 + start;
      std::vector<float> back(m);
      HalvesToFloats(a, back.data(), m);
      for (size_t i = 0; i < m; ++i) ASSERT_EQ(Bits(back[i]), Bits(HalfToFloat(a[i]))) << a[i];
      std::vector<Half> sum(m);
      SumHalves(a, b, sum.data(), m);
      for (size_t i = 0; i < m; ++i) {
        gloo::float16 ga, gb;
        ga.x = a[i];
        gb.x = b[i];
        const uint16_t gloo_sum = (ga + gb).x;
        const bool nan = (gloo_sum & 0x7C00) == 0x7C00 && (gloo_sum & 0x3FF) != 0;
        ASSERT_EQ(sum[i], FloatToHalf(HalfToFloat(a[i]) + HalfToFloat(b[i]))) << a[i] << "+" << b[i];
        if (!nan) {  // Gloo's own sum<float16> (its NaNs keep their payload)
          ASSERT_EQ(sum[i], gloo_sum) << a[i] << "+" << b[i];
        }
      }
      std::vector<Half> scaled(a, a + m);
      ScaleHalves(scaled.data(), m, 0.25f);
      for (size_t i = 0; i < m; ++i) {
        ASSERT_EQ(scaled[i], FloatToHalf(HalfToFloat(a[i]) * 0.25f)) << a[i];
      }
    }
  }
  // In place: SumHalves into one of its inputs.
  std::vector<Half> acc(halves.begin(), halves.begin() + 1000);
  std::vector<Half> expect(1000);
  for (size_t i = 0; i < 1000; ++i) {
    expect[i] = FloatToHalf(HalfToFloat(acc[i]) + HalfToFloat(halves[70000 + i]));
  }
  SumHalves(acc.data(), halves.data() + 70000, acc.data(), 1000);
  EXPECT_EQ(acc, expect);
}

}  // namespace
}  // namespace joule::worker
