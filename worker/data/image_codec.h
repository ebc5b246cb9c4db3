#ifndef JOULE_WORKER_DATA_IMAGE_CODEC_H_
#define JOULE_WORKER_DATA_IMAGE_CODEC_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace joule::worker {

// An 8-bit RGB image, rows top to bottom, pixels interleaved (HWC): pixel (y, x) channel
// c is pixels[(y * width + x) * 3 + c].
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

// The largest dimensions DecodeImage accepts (each side, and width x height): a file that
// claims more is refused before any pixel memory is allocated.
inline constexpr int kMaxImageSide = 32768;
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;  // 64 Mpixel, 192 MiB RGB

// Decodes a JPEG (libjpeg-turbo) or PNG (libpng) held in `bytes` into RGB, as Pillow's
// Image.open(f).convert("RGB") does, so that a pipeline written against torchvision sees
// the same pixels:
//   JPEG: libjpeg's defaults (islow DCT, fancy upsampling), grayscale and YCbCr to RGB;
//     pixel-identical to Pillow built on the same libjpeg-turbo. CMYK/YCCK are refused.
//     `scale_denominator` 2, 4 or 8 decodes at 1/2, 1/4 or 1/8 size in the DCT domain
//     (libjpeg's scale_denom: a cheap downscale, used when an image will be shrunk at
//     least that much anyway); 1 is full size; PNGs ignore it.
//   PNG: palette expanded, gray replicated, 16-bit channels cut to their high byte,
//     alpha (and tRNS) dropped, no gamma applied (Pillow's conversions); interlaced
//     images too.
// The format is told by the signature, not the file name. `name` only labels errors.
// Errors: DATA_LOSS naming `name` for anything else: not JPEG or PNG, truncated or
// corrupt data (libjpeg's or libpng's own message), dimensions past the limits above, an
// unsupported colour space, a progressive JPEG of more than 1,000 scans. Thread-safe (no shared state).
absl::StatusOr<RgbImage> DecodeImage(std::span<const uint8_t> bytes, const std::string& name,
                                     int scale_denominator = 1);

// The dimensions DecodeImage would give at `scale_denominator` without decoding pixels
// (the header only). Errors: those of DecodeImage for the header.
struct ImageSize {
  int width = 0;
  int height = 0;
};
absl::StatusOr<ImageSize> ReadImageSize(std::span<const uint8_t> bytes, const std::string& name,
                                        int scale_denominator = 1);

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_IMAGE_CODEC_H_
