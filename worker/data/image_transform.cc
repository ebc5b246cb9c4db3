#include "worker/data/image_transform.h"

#include <algorithm>
#include <cmath>

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

// Cuts `box` (full-size coordinates) from `image`, decoded at 1/`scale`, resizes it to
// out_h x out_w (bilinear, antialiased), and normalises: float [3, out_h, out_w].
torch::Tensor CropResize(const RgbImage& image, int scale, CropBox box, int out_h, int out_w,
                         const ImageTransformOptions& o) {
  // The box in the decoded image's pixels, inside it.
  const int top = std::min(box.top / scale, image.height - 1);
  const int left = std::min(box.left / scale, image.width - 1);
  const int h = std::clamp((box.height + scale - 1) / scale, 1, image.height - top);
  const int w = std::clamp((box.width + scale - 1) / scale, 1, image.width - left);
  torch::Tensor hwc = torch::from_blob(const_cast<uint8_t*>(image.pixels.data()),
                                       {image.height, image.width, 3}, torch::kUInt8);
  torch::Tensor x = hwc.slice(0, top, top + h)
                        .slice(1, left, left + w)
                        .permute({2, 0, 1})
                        .to(torch::kFloat32)
                        .unsqueeze(0);
  if (h != out_h || w != out_w) {
    namespace F = torch::nn::functional;
    x = F::interpolate(x, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{out_h, out_w})
                              .mode(torch::kBilinear)
                              .align_corners(false)
                              .antialias(true));
  }
  x = x.squeeze(0);
  // ToTensor's /255 and Normalize in one: (v / 255 - mean) / std.
  const auto mean = torch::tensor({o.mean[0], o.mean[1], o.mean[2]}).view({3, 1, 1});
  const auto stdev = torch::tensor({o.std[0], o.std[1], o.std[2]}).view({3, 1, 1});
  return x.div_(255.0f).sub_(mean).div_(stdev).contiguous();
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
    const int w = RoundHalfEven(std::sqrt(target * aspect));
    const int h = RoundHalfEven(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int top = static_cast<int>(rng.UniformInt(0, height - h));
      const int left = static_cast<int>(rng.UniformInt(0, width - w));
      return {top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < o.ratio_min) {
    h = RoundHalfEven(w / o.ratio_min);
  } else if (in_ratio > o.ratio_max) {
    w = RoundHalfEven(h * o.ratio_max);
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
  int scale = ScaleFor(box.width, box.height, o.size, o.exact_decode);
  absl::StatusOr<RgbImage> image = DecodeImage(bytes, name, scale);
  if (!image.ok()) return image.status();
  if (image->width == full->width) scale = 1;  // a PNG: decoded at full size anyway
  torch::NoGradGuard no_grad;
  torch::Tensor x = CropResize(*image, scale, box, o.size, o.size, o);
  if (flip) x = x.flip({2}).contiguous();
  return x;
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
  int scale = ScaleFor(full->width * o.size / std::max(1, rw),
                       full->height * o.size / std::max(1, rh), o.size, o.exact_decode);
  absl::StatusOr<RgbImage> image = DecodeImage(bytes, name, scale);
  if (!image.ok()) return image.status();
  if (image->width == full->width) scale = 1;
  torch::NoGradGuard no_grad;
  // The whole image resized, then the centre cut: resizing only the cut region would
  // be cheaper but differ at the cut's edges from torchvision's order.
  const CropBox whole{0, 0, full->height, full->width};
  torch::Tensor x = CropResize(*image, scale, whole, rh, rw, o);
  const int top = RoundHalfEven((rh - crop) / 2.0);
  const int left = RoundHalfEven((rw - crop) / 2.0);
  return x.slice(1, top, top + crop).slice(2, left, left + crop).contiguous();
}

}  // namespace joule::worker
