#ifndef JOULE_WORKER_COMM_HALF_H_
#define JOULE_WORKER_COMM_HALF_H_

// IEEE 754 binary16 conversions on the host, the one definition every transport uses (Gloo,
// shared memory, NCCL's host path), so that a value rounds alike whichever carries it.
// The results are those of Gloo's cpu_float2half_rn and cpu_half2float bit for bit
// (tests/worker/half_test.cc compares them over every half and a sweep of floats); the
// header itself needs neither Gloo nor CUDA. Pure functions: thread-safe.

#include <bit>
#include <cstddef>
#include <cstdint>

#include "worker/comm/process_group.h"  // Half

namespace joule::worker {

// float32 to binary16, rounding to nearest with ties to even (IEEE 754 roundTiesToEven):
// - magnitudes of at least 65520 (halfway between the largest half, 65504, and 2^16)
//   and infinities become infinity of the same sign;
// - NaNs become 0x7FFF (a positive quiet NaN: sign and payload are not kept);
// - magnitudes in [2^-25, 2^-14) become subnormals (2^-25 itself, a tie, rounds to zero);
//   smaller ones become a zero of the same sign.
inline Half FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t u = x & 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7fffu;  // NaN
  const uint32_t sign = (x >> 16) & 0x8000u;
  if (u > 0x477fefffu) return static_cast<Half>(sign | 0x7c00u);  // >= 65520: infinity
  if (u < 0x33000001u) return static_cast<Half>(sign);            // <= 2^-25: zero
  uint32_t exponent = (u >> 23) & 0xffu;
  uint32_t mantissa = u & 0x7fffffu;
  uint32_t shift;
  if (exponent > 0x70) {  // a normal half
    shift = 13;
    exponent -= 0x70;
  } else {  // a subnormal half: the implicit bit joins the mantissa
    shift = 0x7e - exponent;
    exponent = 0;
    mantissa |= 0x800000u;
  }
  const uint32_t lsb = 1u << shift;
  const uint32_t half_lsb = lsb >> 1;
  const uint32_t remainder = mantissa & (lsb - 1);
  mantissa >>= shift;
  if (remainder > half_lsb || (remainder == half_lsb && (mantissa & 1u))) {
    ++mantissa;
    if ((mantissa & 0x3ffu) == 0) {  // carried into the exponent
      ++exponent;
      mantissa = 0;
    }
  }
  return static_cast<Half>(sign | (exponent << 10) | mantissa);
}

// binary16 to float32, exact for every finite half and for infinities; NaNs become
// 0x7FFFFFFF (a positive quiet NaN).
inline float HalfToFloat(Half h) {
  uint32_t sign = (h >> 15) & 1u;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = static_cast<uint32_t>(h & 0x3ffu) << 13;
  if (exponent == 0x1f) {  // infinity or NaN
    if (mantissa != 0) {
      sign = 0;
      mantissa = 0x7fffffu;
    }
    exponent = 0xff;
  } else if (exponent == 0) {  // zero or subnormal: normalise
    if (mantissa != 0) {
      exponent = 0x71;
      uint32_t msb;
      do {
        msb = mantissa & 0x400000u;
        mantissa <<= 1;
        --exponent;
      } while (msb == 0);
      mantissa &= 0x7fffffu;
    }
  } else {
    exponent += 0x70;
  }
  return std::bit_cast<float>((sign << 31) | (exponent << 23) | mantissa);
}

// `f` rounded to the nearest half, as a float.
inline float RoundToHalf(float f) { return HalfToFloat(FloatToHalf(f)); }

// What one rank contributes to an allreduce with fp16 on the wire (PyTorch DDP's
// fp16_compress_hook): its value rounded to half, then multiplied by `scale` (1 for a
// sum, 1 / world size for an average: dividing before the sum keeps N large values from
// overflowing it) and rounded to half again.
inline Half Fp16WireValue(float f, float scale) {
  return FloatToHalf(RoundToHalf(f) * scale);
}

// Bulk forms, for the transports' hot loops: each element's result is that of the scalar
// function above, bit for bit, NaNs included (tests/worker/half_test.cc). Where the CPU has
// F16C and AVX (checked once, at first use) eight elements at a time with vcvtps2ph /
// vcvtph2ps (round to nearest even, which MXCSR's FTZ and DAZ do not change), with the
// scalar results patched in for NaN lanes; elsewhere, and for the tail, the scalar loop.
// `n` elements each; the arrays may not overlap unless noted. Thread-safe.

// out[i] = FloatToHalf(in[i]).
void FloatsToHalves(const float* in, Half* out, size_t n);
// out[i] = HalfToFloat(in[i]).
void HalvesToFloats(const Half* in, float* out, size_t n);
// out[i] = Fp16WireValue(in[i], scale).
void ToFp16Wire(const float* in, float scale, Half* out, size_t n);
// data[i] = RoundToHalf(data[i]), in place.
void RoundToHalves(float* data, size_t n);
// out[i] = FloatToHalf(HalfToFloat(a[i]) + HalfToFloat(b[i])): Gloo's sum<float16>
// (operator+ on gloo::float16); `out` may be `a` or `b`.
void SumHalves(const Half* a, const Half* b, Half* out, size_t n);
// data[i] = FloatToHalf(HalfToFloat(data[i]) * scale), in place.
void ScaleHalves(Half* data, size_t n, float scale);
// Whether the bulk forms run vectorised on this CPU (F16C and AVX).
bool HalfConversionsVectorised();

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_HALF_H_
