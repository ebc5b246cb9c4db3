#ifndef JOULE_WORKER_DATA_IMAGE_TRANSFORM_H_
#define JOULE_WORKER_DATA_IMAGE_TRANSFORM_H_

// Includes LibTorch: only worker/train .cc files, worker/data's transform and tests
// include this header.
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"

namespace joule::worker {

// The image pipeline of an imagefolder: job, torchvision's transforms in their order:
//   train: RandomResizedCrop(size, scale, ratio) (or, without it, the eval pipeline),
//          RandomHorizontalFlip(0.5) if hflip, ToTensor, Normalize(mean, std)
//   eval:  Resize(eval_resize) (the shorter side), CenterCrop(size), ToTensor, Normalize
// Resizing is Pillow's antialiased bilinear resampling (libImaging/Resample.c: the triangle
// filter widened by the downscale factor, horizontal pass then vertical), as torchvision
// runs it on PIL images, computed in float without Pillow's rounding between passes. Unless exact_decode, a JPEG is decoded at 1/2, 1/4
// or 1/8 size in the DCT domain when what is cut from it is at least that many times the
// output side (DALI and FFCV do the same; the crop box is drawn on the full-size image
// first, so the random draws are the same either way).
struct ImageTransformOptions {
  int size = 224;               // output side, pixels
  bool random_resized_crop = true;
  double scale_min = 0.08, scale_max = 1.0;          // area fraction of the crop
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // its width / height
  bool hflip = true;
  // Normalize: ImageNet's (torchvision's references) unless normalize is "none".
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
  int eval_resize = 256;        // shorter side before the centre crop
  bool exact_decode = false;
  // Evaluation through the training pipeline (ImageBatchLoader::Eval), as the second
  // paper's code did.
  bool eval_uses_train_transform = false;

  // From a validated spec (job_spec.h fills the defaults: AugmentSpec in job.proto).
  static ImageTransformOptions FromSpec(const v1::AugmentSpec& spec);
};

// The random draws of one example in one epoch: a SplitMix64 stream (Steele et al. 2014)
// keyed by (seed, epoch, index), so an example gets the same crop and flip in an epoch
// whichever rank draws it, at any world size, and again after a resume. Not thread-safe
// (one per example).
class ExampleRng {
 public:
  ExampleRng(uint64_t seed, int64_t epoch, int64_t index);
  uint64_t Next();
  double Uniform(double lo, double hi);     // [lo, hi), 53 random bits
  int64_t UniformInt(int64_t lo, int64_t hi);  // [lo, hi], hi >= lo

 private:
  uint64_t state_;
};

// A crop box in pixels of the full-size image: rows [top, top + height), columns
// [left, left + width).
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox&) const = default;
};

// torchvision's RandomResizedCrop.get_params: up to 10 tries of an area fraction
// uniform in [scale_min, scale_max] and a log-uniform aspect ratio, w and h rounded half
// to even (Python's round), the offset uniform; else the centre crop at the nearest
// ratio in range.
CropBox RandomResizedCropBox(int width, int height, const ImageTransformOptions& options,
                             ExampleRng& rng);

// torchvision's F.resized_crop on one encoded image (JPEG or PNG bytes): `box` (pixels of
// the full-size image) cut and resized to size x size, then ToTensor and Normalize; a
// float32 [3, size, size] CPU tensor. JPEGs are decoded at reduced size when the box
// allows, unless exact_decode. Errors: DecodeImage's; INVALID_ARGUMENT for a box not
// inside the image. Thread-safe.
absl::StatusOr<torch::Tensor> ResizedCrop(std::span<const uint8_t> bytes, const std::string& name,
                                          CropBox box, const ImageTransformOptions& options);

// The training and evaluation pipelines on one encoded image (JPEG or PNG bytes):
// a float32 [3, size, size] CPU tensor. `name` labels errors. Errors: DecodeImage's
// (DATA_LOSS naming the file). Thread-safe.
absl::StatusOr<torch::Tensor> TrainTransform(std::span<const uint8_t> bytes,
                                             const std::string& name,
                                             const ImageTransformOptions& options,
                                             ExampleRng& rng);
absl::StatusOr<torch::Tensor> EvalTransform(std::span<const uint8_t> bytes,
                                            const std::string& name,
                                            const ImageTransformOptions& options);

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_IMAGE_TRANSFORM_H_
