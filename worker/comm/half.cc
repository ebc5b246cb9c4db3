#include "worker/comm/half.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define JOULE_HALF_X86 1
#endif

namespace joule::worker {
namespace {

#ifdef JOULE_HALF_X86
// Each function below is compiled for AVX + F16C only; callers reach it only where the
// CPU has both (Vectorised()).
#define JOULE_F16C __attribute__((target("avx,f16c")))
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// `v` with the lanes whose bit is set in `mask` replaced by `value` (eight lanes).
template <typename Lane, typename Vec>
JOULE_F16C inline Vec SetLanes(Vec v, int mask, Lane value) {
  static_assert(sizeof(Vec) == 8 * sizeof(Lane));
  Lane lanes[8];
  std::memcpy(lanes, &v, sizeof v);
  for (int i = 0; i < 8; ++i) {
    if (mask & (1 << i)) lanes[i] = value;
  }
  std::memcpy(&v, lanes, sizeof v);
  return v;
}

// NaN lanes are patched after a branch on a movemask (NaNs are rare), not with a blend:
// GCC 12 lowers that blend to eight scalar selects.

// Eight floats to halves; NaN lanes get FloatToHalf's canonical NaN.
JOULE_F16C inline __m128i ToHalf8(__m256 v) {
  const __m128i h = _mm256_cvtps_ph(v, kRound);
  const int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  if (nan != 0) [[unlikely]] return SetLanes<uint16_t>(h, nan, uint16_t{0x7fff});
  return h;
}

// Eight halves to floats; NaN lanes get HalfToFloat's canonical NaN.
JOULE_F16C inline __m256 ToFloat8(__m128i h) {
  const __m256 v = _mm256_cvtph_ps(h);
  const int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  if (nan != 0) [[unlikely]] return SetLanes<uint32_t>(v, nan, uint32_t{0x7fffffff});
  return v;
}

JOULE_F16C inline __m128i LoadHalf8(const Half* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
JOULE_F16C inline void StoreHalf8(Half* p, __m128i h) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
}

JOULE_F16C size_t FloatsToHalvesF16c(const float* in, Half* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) StoreHalf8(out + i, ToHalf8(_mm256_loadu_ps(in + i)));
  return i;
}
JOULE_F16C size_t HalvesToFloatsF16c(const Half* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, ToFloat8(LoadHalf8(in + i)));
  return i;
}
JOULE_F16C size_t ToFp16WireF16c(const float* in, float scale, Half* out, size_t n) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 rounded = ToFloat8(ToHalf8(_mm256_loadu_ps(in + i)));
    StoreHalf8(out + i, ToHalf8(_mm256_mul_ps(rounded, s)));
  }
  return i;
}
JOULE_F16C size_t RoundToHalvesF16c(float* data, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(data + i, ToFloat8(ToHalf8(_mm256_loadu_ps(data + i))));
  }
  return i;
}
JOULE_F16C size_t SumHalvesF16c(const Half* a, const Half* b, Half* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 sum = _mm256_add_ps(ToFloat8(LoadHalf8(a + i)), ToFloat8(LoadHalf8(b + i)));
    StoreHalf8(out + i, ToHalf8(sum));
  }
  return i;
}
JOULE_F16C size_t ScaleHalvesF16c(Half* data, size_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    StoreHalf8(data + i, ToHalf8(_mm256_mul_ps(ToFloat8(LoadHalf8(data + i)), s)));
  }
  return i;
}

bool Vectorised() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return yes;
}
#else
bool Vectorised() { return false; }
#endif

}  // namespace

bool HalfConversionsVectorised() { return Vectorised(); }

// Each bulk form: the vector loop where available (it returns how far it got), then the
// scalar function for the rest.
void FloatsToHalves(const float* in, Half* out, size_t n) {
  size_t i = 0;
#ifdef JOULE_HALF_X86
  if (Vectorised()) i = FloatsToHalvesF16c(in, out, n);
#endif
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

void HalvesToFloats(const Half* in, float* out, size_t n) {
  size_t i = 0;
#ifdef JOULE_HALF_X86
  if (Vectorised()) i = HalvesToFloatsF16c(in, out, n);
#endif
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

void ToFp16Wire(const float* in, float scale, Half* out, size_t n) {
  size_t i = 0;
#ifdef JOULE_HALF_X86
  if (Vectorised()) i = ToFp16WireF16c(in, scale, out, n);
#endif
  for (; i < n; ++i) out[i] = Fp16WireValue(in[i], scale);
}

void RoundToHalves(float* data, size_t n) {
  size_t i = 0;
#ifdef JOULE_HALF_X86
  if (Vectorised()) i = RoundToHalvesF16c(data, n);
#endif
  for (; i < n; ++i) data[i] = RoundToHalf(data[i]);
}

void SumHalves(const Half* a, const Half* b, Half* out, size_t n) {
  size_t i = 0;
#ifdef JOULE_HALF_X86
  if (Vectorised()) i = SumHalvesF16c(a, b, out, n);
#endif
  for (; i < n; ++i) out[i] = FloatToHalf(HalfToFloat(a[i]) + HalfToFloat(b[i]));
}

void ScaleHalves(Half* data, size_t n, float scale) {
  size_t i = 0;
#ifdef JOULE_HALF_X86
  if (Vectorised()) i = ScaleHalvesF16c(data, n, scale);
#endif
  for (; i < n; ++i) data[i] = FloatToHalf(HalfToFloat(data[i]) * scale);
}

}  // namespace joule::worker
