#include "worker/data/image_transform.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/data/image_codec.h"

namespace joule::worker {
namespace {

uint64_t Mix(uint64_t z) {  // SplitMix64's output function
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// Python's round(): half to even (the default floating-point rounding mode).
int RoundHalfEven(double v) { return static_cast<int>(std::nearbyint(v)); }

// The largest DCT-domain downscale (1, 2, 4 or 8) that leaves a `box_w` x `box_h` cut
// at least `want` x `want` pixels.
int ScaleFor(int box_w, int box_h, int want, bool exact) {
  if (exact) return 1;
  for (int d : {8, 4, 2}) {
    if (box_w / d >= want && box_h / d >= want) return d;
  }
  return 1;
}

// One axis of Pillow's resampling (ImagingResample in libImaging/Resample.c, the
// bilinear filter): for each output pixel, the first input pixel it reads and its
// normalised weights. The box [lo, hi) (fractional input pixels: a crop box, possibly in
// a DCT-downscaled image) is resized to `out_size` pixels, of which only outputs
// [from, from + n) are computed; taps are clamped to the input pixels [in_lo, in_hi), as
// resampling an image cropped to them first would be (torchvision's crop, then resize).
struct AxisWeights {
  std::vector<int> first;       // per computed output pixel
  std::vector<int> count;       // taps per computed output pixel
  std::vector<float> weights;   // n x taps, row-major
  int taps = 0;
};

AxisWeights BilinearWeights(double lo, double hi, int in_lo, int in_hi, int out_size, int from,
                            int n) {
  const double scale = (hi - lo) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;  // the triangle's radius, widened to antialias
  AxisWeights a;
  a.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  a.first.resize(n);
  a.count.resize(n);
  a.weights.assign(static_cast<size_t>(n) * a.taps, 0.0f);
  std::vector<double> w(static_cast<size_t>(a.taps));
  for (int i = 0; i < n; ++i) {
    const double center = lo + (from + i + 0.5) * scale;
    const int xmin = std::clamp(static_cast<int>(center - support + 0.5), in_lo, in_hi - 1);
    const int xmax = std::clamp(static_cast<int>(center + support + 0.5), xmin + 1, in_hi);
    const int taps = std::min(xmax - xmin, a.taps);
    double total = 0;
    for (int k = 0; k < taps; ++k) {
      const double t = std::abs((k + xmin - center + 0.5) / filter_scale);
      w[k] = t < 1.0 ? 1.0 - t : 0.0;
      total += w[k];
    }
    a.first[i] = xmin;
    a.count[i] = taps;
    for (int k = 0; k < taps; ++k) {
      // All-zero weights (a box narrower than a pixel at an edge): the nearest pixel.
      a.weights[static_cast<size_t>(i) * a.taps + k] =
          static_cast<float>(total > 0 ? w[k] / total : (k == 0 ? 1.0 : 0.0));
    }
  }
  return a;
}

// Cuts the box [x0, x1) x [y0, y1) (fractional pixels of `image`), resizes it to
// size_h x size_w with Pillow's antialiased bilinear resampling (the horizontal pass,
// then the vertical, as Pillow; kept in float where Pillow rounds between them), keeps
// the window of out_h x out_w outputs at (win_top, win_left) (a centre crop after the
// resize, computed alone), then ToTensor's /255 and Normalize: float [3, out_h, out_w].
torch::Tensor CropResize(const RgbImage& image, double x0, double y0, double x1, double y1,
                         int size_h, int size_w, int win_top, int win_left, int out_h,
                         int out_w, const ImageTransformOptions& o) {
  // The input pixels the box covers (whole pixels; a fractional edge counts its pixel).
  const auto span = [](double lo, double hi, int size) {
    const int first = std::clamp(static_cast<int>(std::floor(lo + 1e-9)), 0, size - 1);
    const int last = std::clamp(static_cast<int>(std::ceil(hi - 1e-9)), first + 1, size);
    return std::pair{first, last};
  };
  const auto [xs, xe] = span(x0, x1, image.width);
  const auto [ys, ye] = span(y0, y1, image.height);
  const AxisWeights wx = BilinearWeights(x0, x1, xs, xe, size_w, win_left, out_w);
  const AxisWeights wy = BilinearWeights(y0, y1, ys, ye, size_h, win_top, out_h);
  // The input rows the vertical pass reads.
  int row_lo = image.height, row_hi = 0;
  for (int y = 0; y < out_h; ++y) {
    row_lo = std::min(row_lo, wy.first[y]);
    row_hi = std::max(row_hi, wy.first[y] + wy.count[y]);
  }
  row_hi = std::max(row_hi, row_lo);
  // Horizontal pass: rows [row_lo, row_hi) x out_w x 3, interleaved.
  thread_local std::vector<float> tmp;
  tmp.resize(static_cast<size_t>(row_hi - row_lo) * out_w * 3);
  for (int r = row_lo; r < row_hi; ++r) {
    const uint8_t* in = image.pixels.data() + static_cast<size_t>(r) * image.width * 3;
    float* out = tmp.data() + static_cast<size_t>(r - row_lo) * out_w * 3;
    for (int x = 0; x < out_w; ++x) {
      const float* w = wx.weights.data() + static_cast<size_t>(x) * wx.taps;
      const uint8_t* p = in + static_cast<size_t>(wx.first[x]) * 3;
      float s0 = 0, s1 = 0, s2 = 0;
      for (int k = 0; k < wx.count[x]; ++k) {
        s0 += w[k] * p[3 * k];
        s1 += w[k] * p[3 * k + 1];
        s2 += w[k] * p[3 * k + 2];
      }
      out[3 * x] = s0;
      out[3 * x + 1] = s1;
      out[3 * x + 2] = s2;
    }
  }
  // Vertical pass into CHW, with (v / 255 - mean) / std folded into one multiply-add.
  torch::Tensor result = torch::empty({3, out_h, out_w}, torch::kFloat32);
  float* dst = result.data_ptr<float>();
  float mul[3], add[3];
  for (int c = 0; c < 3; ++c) {
    mul[c] = 1.0f / (255.0f * o.std[c]);
    add[c] = -o.mean[c] / o.std[c];
  }
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  for (int y = 0; y < out_h; ++y) {
    const float* w = wy.weights.data() + static_cast<size_t>(y) * wy.taps;
    for (int x = 0; x < out_w; ++x) {
      float s0 = 0, s1 = 0, s2 = 0;
      for (int k = 0; k < wy.count[y]; ++k) {
        const float* p =
            tmp.data() + (static_cast<size_t>(wy.first[y] + k - row_lo) * out_w + x) * 3;
        s0 += w[k] * p[0];
        s1 += w[k] * p[1];
        s2 += w[k] * p[2];
      }
      const size_t at = static_cast<size_t>(y) * out_w + x;
      dst[at] = s0 * mul[0] + add[0];
      dst[plane + at] = s1 * mul[1] + add[1];
      dst[2 * plane + at] = s2 * mul[2] + add[2];
    }
  }
  return result;
}

// CropResize of `box` (pixels of the full-size image `full`) on `image`, which may be a
// DCT-downscaled decode of it: the box scales with the image.
torch::Tensor CropResizeFull(const RgbImage& image, const ImageSize& full, int scale,
                             CropBox box, int size_h, int size_w, int win_top, int win_left,
                             int out_h, int out_w, const ImageTransformOptions& o) {
  // libjpeg's 1/d decode (`scale` asked) maps its pixel j to full pixels [j d, (j + 1) d)
  // (the last one partial: the size is rounded up), so the box scales by exactly 1/d; a
  // PNG (decoded whole whatever was asked) by 1.
  const bool whole = image.width == full.width && image.height == full.height;
  const double sx = whole ? 1.0 : 1.0 / scale, sy = sx;
  return CropResize(image, box.left * sx, box.top * sy, (box.left + box.width) * sx,
                    (box.top + box.height) * sy, size_h, size_w, win_top, win_left, out_h,
                    out_w, o);
}

}  // namespace

ImageTransformOptions ImageTransformOptions::FromSpec(const v1::AugmentSpec& spec) {
  ImageTransformOptions o;
  o.random_resized_crop = spec.has_random_resized_crop();
  const v1::RandomResizedCropSpec& c = spec.random_resized_crop();
  o.size = o.random_resized_crop && c.size() > 0 ? c.size() : spec.size() > 0 ? spec.size() : 224;
  if (c.scale_size() == 2) {
    o.scale_min = c.scale(0);
    o.scale_max = c.scale(1);
  }
  if (c.ratio_size() == 2) {
    o.ratio_min = c.ratio(0);
    o.ratio_max = c.ratio(1);
  }
  o.hflip = spec.hflip();
  if (spec.normalize() == "none") {
    o.mean = {0, 0, 0};
    o.std = {1, 1, 1};
  }
  o.eval_resize = spec.eval_resize() > 0 ? spec.eval_resize()
                                         : static_cast<int>(std::lround(o.size * 256.0 / 224.0));
  o.exact_decode = spec.exact_decode();
  o.eval_uses_train_transform = spec.eval_uses_train_transform();
  return o;
}

ExampleRng::ExampleRng(uint64_t seed, int64_t epoch, int64_t index)
    : state_(Mix(Mix(Mix(seed + kGolden) + static_cast<uint64_t>(epoch)) +
                 static_cast<uint64_t>(index))) {}

uint64_t ExampleRng::Next() {
  state_ += kGolden;
  return Mix(state_);
}

double ExampleRng::Uniform(double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(Next() >> 11) * 0x1.0p-53;
}

int64_t ExampleRng::UniformInt(int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(Next() % span);  // bias < span / 2^64: negligible
}

CropBox RandomResizedCropBox(int width, int height, const ImageTransformOptions& o,
                             ExampleRng& rng) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.Uniform(o.scale_min, o.scale_max);
    const double aspect = std::exp(rng.Uniform(log_lo, log_hi));
    // Compared as doubles first: a huge aspect must not overflow the int.
    const double wd = std::nearbyint(std::sqrt(target * aspect));
    const double hd = std::nearbyint(std::sqrt(target / aspect));
    if (wd > 0 && wd <= width && hd > 0 && hd <= height) {
      const int w = static_cast<int>(wd), h = static_cast<int>(hd);
      const int top = static_cast<int>(rng.UniformInt(0, height - h));
      const int left = static_cast<int>(rng.UniformInt(0, width - w));
      return {top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < o.ratio_min) {
    h = std::clamp(RoundHalfEven(w / o.ratio_min), 1, height);
  } else if (in_ratio > o.ratio_max) {
    w = std::clamp(RoundHalfEven(h * o.ratio_max), 1, width);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

absl::StatusOr<torch::Tensor> TrainTransform(std::span<const uint8_t> bytes,
                                             const std::string& name,
                                             const ImageTransformOptions& o, ExampleRng& rng) {
  if (!o.random_resized_crop) {
    absl::StatusOr<torch::Tensor> x = EvalTransform(bytes, name, o);
    if (x.ok() && o.hflip && rng.Uniform(0, 1) < 0.5) return x->flip({2}).contiguous();
    return x;
  }
  absl::StatusOr<ImageSize> full = ReadImageSize(bytes, name);
  if (!full.ok()) return full.status();
  const CropBox box = RandomResizedCropBox(full->width, full->height, o, rng);
  const bool flip = o.hflip && rng.Uniform(0, 1) < 0.5;
  absl::StatusOr<torch::Tensor> x = ResizedCrop(bytes, name, box, o);
  if (x.ok() && flip) return x->flip({2}).contiguous();
  return x;
}

absl::StatusOr<torch::Tensor> ResizedCrop(std::span<const uint8_t> bytes, const std::string& name,
                                          CropBox box, const ImageTransformOptions& o) {
  absl::StatusOr<ImageSize> full = ReadImageSize(bytes, name);
  if (!full.ok()) return full.status();
  if (box.top < 0 || box.left < 0 || box.height < 1 || box.width < 1 ||
      box.top + box.height > full->height || box.left + box.width > full->width) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": crop box (", box.left, ", ", box.top, ") ", box.width, "x", box.height,
        " is not inside the ", full->width, "x", full->height, " image"));
  }
  const int scale = ScaleFor(box.width, box.height, o.size, o.exact_decode);
  absl::StatusOr<RgbImage> image = DecodeImage(bytes, name, scale);
  if (!image.ok()) return image.status();
  torch::NoGradGuard no_grad;
  return CropResizeFull(*image, *full, scale, box, o.size, o.size, 0, 0, o.size, o.size, o);
}

absl::StatusOr<torch::Tensor> EvalTransform(std::span<const uint8_t> bytes,
                                            const std::string& name,
                                            const ImageTransformOptions& o) {
  absl::StatusOr<ImageSize> full = ReadImageSize(bytes, name);
  if (!full.ok()) return full.status();
  // Resize(eval_resize): the shorter side to eval_resize, the longer in proportion
  // (truncated, as torchvision), then CenterCrop(size) (offsets rounded half to even).
  const int short_side = std::min(full->width, full->height);
  const int long_side = std::max(full->width, full->height);
  const int new_short = o.eval_resize;
  const int new_long = static_cast<int>(static_cast<int64_t>(new_short) * long_side / short_side);
  const int rw = full->width <= full->height ? new_short : new_long;
  const int rh = full->width <= full->height ? new_long : new_short;
  const int crop = std::min({o.size, rw, rh});
  const int scale = ScaleFor(full->width * o.size / std::max(1, rw),
                             full->height * o.size / std::max(1, rh), o.size, o.exact_decode);
  absl::StatusOr<RgbImage> image = DecodeImage(bytes, name, scale);
  if (!image.ok()) return image.status();
  torch::NoGradGuard no_grad;
  // The whole image resized, then the centre cut: only the cut's outputs are computed,
  // with the whole resize's weights (the same values as resizing all and cutting).
  const CropBox whole{0, 0, full->height, full->width};
  const int top = RoundHalfEven((rh - crop) / 2.0);
  const int left = RoundHalfEven((rw - crop) / 2.0);
  return CropResizeFull(*image, *full, scale, whole, rh, rw, top, left, crop, crop, o);
}

}  // namespace joule::worker
