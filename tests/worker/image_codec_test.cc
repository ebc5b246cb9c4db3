#include "worker/data/image_codec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/data/image_transform.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> ReadBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// The images pillow_images.py writes, with Pillow's decodings; empty when Python or
// Pillow is missing.
const fs::path& PillowImages() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / absl::StrCat("joule-pillow-", getpid());
    fs::remove_all(d);
    const std::string cmd = absl::StrCat("/usr/bin/python3 ", JOULE_SOURCE_DIR,
                                         "/tests/worker/pillow_images.py ", d.string(),
                                         " >/dev/null 2>&1");
    return std::system(cmd.c_str()) == 0 ? d : fs::path();
  }();
  return dir;
}

class ImageCodecTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    if (!PillowImages().empty()) fs::remove_all(PillowImages());
  }
};

TEST_F(ImageCodecTest, DecodesEveryModeAsPillowDoes) {
  if (PillowImages().empty()) GTEST_SKIP() << "python3-pil is not installed";
  int compared = 0;
  for (const auto& e : fs::directory_iterator(PillowImages())) {
    const fs::path p = e.path();
    if (p.extension() == ".rgb" || p.extension() == ".bad" || p.extension() == ".eval-40-32" ||
        p.extension() == ".crop-16") {
      continue;
    }
    const std::vector<uint8_t> want = ReadBytes(p.string() + ".rgb");
    ASSERT_GE(want.size(), 8u) << p;
    uint32_t w, h;
    std::memcpy(&w, want.data(), 4);
    std::memcpy(&h, want.data() + 4, 4);
    absl::StatusOr<RgbImage> got = DecodeImage(ReadBytes(p), p.filename().string());
    ASSERT_TRUE(got.ok()) << p << ": " << got.status();
    ASSERT_EQ(got->width, static_cast<int>(w)) << p;
    ASSERT_EQ(got->height, static_cast<int>(h)) << p;
    ASSERT_EQ(got->pixels.size(), size_t{w} * h * 3) << p;
    const std::string name = p.filename().string();
    int max_diff = 0;
    for (size_t i = 0; i < got->pixels.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(int{got->pixels[i]} - int{want[8 + i]}));
    }
    if (name == "grey-16.png") {
      // Pillow saturates 16-bit samples at 255 on the way to RGB (its I;16 -> L); Joule
      // keeps the high byte, as libpng's strip_16 and torchvision's decode_png do.
      EXPECT_GT(max_diff, 0) << "the reference is expected to saturate";
      const RgbImage& img = *got;
      EXPECT_EQ(img.pixels[0], img.pixels[1]);
      continue;
    }
    // PNG: the same bytes; JPEG: the same libjpeg-turbo with the same settings (Debian's
    // Pillow links libjpeg62-turbo), so the same bytes too.
    EXPECT_EQ(max_diff, 0) << name << ": largest difference from Pillow";
    ++compared;
  }
  EXPECT_EQ(compared, 15);
  absl::StatusOr<RgbImage> cmyk =
      DecodeImage(ReadBytes(PillowImages() / "cmyk.jpg.bad"), "cmyk.jpg");
  EXPECT_EQ(cmyk.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(cmyk.status().message(), "cmyk.jpg: CMYK")) << cmyk.status();
}

TEST_F(ImageCodecTest, TheEvalTransformResamplesAsPillowDoes) {
  // torchvision's Resize(40) + CenterCrop(32) on PIL images against EvalTransform with
  // normalisation off (x 255 gives Pillow's bytes back): Pillow rounds to bytes between
  // its two passes and at the end, Joule keeps floats, so they agree within one level.
  if (PillowImages().empty()) GTEST_SKIP() << "python3-pil is not installed";
  ImageTransformOptions o;
  o.size = 32;
  o.eval_resize = 40;
  o.exact_decode = true;  // Pillow decodes at full size
  o.mean = {0, 0, 0};
  o.std = {1, 1, 1};
  for (const char* name : {"rgb.png", "grey.png", "rgb-444.jpg"}) {
    const std::vector<uint8_t> want = ReadBytes(PillowImages() / (std::string(name) + ".eval-40-32"));
    ASSERT_EQ(want.size(), 32u * 32 * 3) << name;
    absl::StatusOr<torch::Tensor> got = EvalTransform(ReadBytes(PillowImages() / name), name, o);
    ASSERT_TRUE(got.ok()) << got.status();
    const torch::Tensor bytes = (*got * 255).permute({1, 2, 0}).contiguous();  // HWC
    const torch::Tensor ref =
        torch::from_blob(const_cast<uint8_t*>(want.data()), {32, 32, 3}, torch::kUInt8)
            .to(torch::kFloat32);
    const double max_diff = (bytes - ref).abs().max().item<double>();
    EXPECT_LE(max_diff, 1.0) << name;
    EXPECT_LT((bytes - ref).abs().mean().item<double>(), 0.5) << name;
  }
}

TEST_F(ImageCodecTest, ResizedCropResamplesTheCropAlonePillowsWay) {
  // torchvision's resized_crop on PIL, crop then resize: the taps at the crop's edges
  // must not reach the pixels outside it.
  if (PillowImages().empty()) GTEST_SKIP() << "python3-pil is not installed";
  ImageTransformOptions o;
  o.size = 16;
  o.exact_decode = true;
  o.mean = {0, 0, 0};
  o.std = {1, 1, 1};
  for (const char* name : {"rgb.png", "rgb-444.jpg"}) {
    const std::vector<uint8_t> want = ReadBytes(PillowImages() / (std::string(name) + ".crop-16"));
    ASSERT_EQ(want.size(), 16u * 16 * 3) << name;
    absl::StatusOr<torch::Tensor> got =
        ResizedCrop(ReadBytes(PillowImages() / name), name, CropBox{5, 11, 40, 50}, o);
    ASSERT_TRUE(got.ok()) << got.status();
    const torch::Tensor bytes = (*got * 255).permute({1, 2, 0}).contiguous();
    const torch::Tensor ref =
        torch::from_blob(const_cast<uint8_t*>(want.data()), {16, 16, 3}, torch::kUInt8)
            .to(torch::kFloat32);
    EXPECT_LE((bytes - ref).abs().max().item<double>(), 1.0) << name;
  }
  // A box outside the image is refused.
  absl::StatusOr<torch::Tensor> outside =
      ResizedCrop(ReadBytes(PillowImages() / "rgb.png"), "rgb.png", CropBox{50, 70, 40, 50}, o);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument) << outside.status();
}

TEST_F(ImageCodecTest, TheDctDomainDownscaleGivesTheScaledSizeAndAlikeImage) {
  if (PillowImages().empty()) GTEST_SKIP() << "python3-pil is not installed";
  const std::vector<uint8_t> bytes = ReadBytes(PillowImages() / "rgb-444.jpg");
  absl::StatusOr<RgbImage> full = DecodeImage(bytes, "full");
  ASSERT_TRUE(full.ok());
  for (int d : {2, 4, 8}) {
    absl::StatusOr<RgbImage> small = DecodeImage(bytes, "small", d);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_EQ(small->width, (full->width + d - 1) / d) << d;  // libjpeg rounds up
    EXPECT_EQ(small->height, (full->height + d - 1) / d) << d;
    absl::StatusOr<ImageSize> header = ReadImageSize(bytes, "header", d);
    ASSERT_TRUE(header.ok());
    EXPECT_EQ(header->width, small->width);
    // Each small pixel is close to the mean of the d x d block it stands for.
    double sum_diff = 0;
    int n = 0;
    for (int y = 0; y + 1 < small->height; ++y) {
      for (int x = 0; x + 1 < small->width; ++x) {
        for (int c = 0; c < 3; ++c) {
          double mean = 0;
          for (int dy = 0; dy < d; ++dy) {
            for (int dx = 0; dx < d; ++dx) {
              mean += full->pixels[((y * d + dy) * full->width + x * d + dx) * 3 + c];
            }
          }
          mean /= d * d;
          sum_diff += std::abs(mean - small->pixels[(y * small->width + x) * 3 + c]);
          ++n;
        }
      }
    }
    EXPECT_LT(sum_diff / n, 8.0) << "scale 1/" << d;
  }
  // A PNG ignores the scale.
  absl::StatusOr<RgbImage> png = DecodeImage(ReadBytes(PillowImages() / "rgb.png"), "png", 4);
  ASSERT_TRUE(png.ok());
  EXPECT_EQ(png->width, 83);
}

// Every damaged form of a valid file is a DATA_LOSS naming it, or (a flipped bit in the
// entropy-coded data) a decoded image of the right size: never a crash, never a hang.
TEST_F(ImageCodecTest, DamagedFilesAreDataLossNamingTheFile) {
  if (PillowImages().empty()) GTEST_SKIP() << "python3-pil is not installed";
  std::mt19937 rng(5);
  for (const char* name : {"rgb-420.jpg", "rgb-progressive.jpg", "rgb.png",
                           "rgb-interlaced.png", "palette.png"}) {
    const std::vector<uint8_t> good = ReadBytes(PillowImages() / name);
    // Truncated at many points, header included: always refused (Pillow refuses
    // truncated files too).
    for (size_t cut : {size_t{0}, size_t{1}, size_t{3}, size_t{8}, size_t{20}, good.size() / 3,
                       good.size() / 2, good.size() - 30}) {
      std::vector<uint8_t> bad(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut));
      absl::StatusOr<RgbImage> got = DecodeImage(bad, name);
      EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << name << " cut at " << cut;
      EXPECT_TRUE(absl::StartsWith(got.status().message(), name)) << got.status();
    }
    // Random bytes changed anywhere: refused or decoded, never anything else.
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<uint8_t> bad = good;
      for (int k = 0; k < 4; ++k) bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      absl::StatusOr<RgbImage> got = DecodeImage(bad, name);
      if (got.ok()) {
        EXPECT_EQ(got->pixels.size(), size_t(got->width) * got->height * 3) << name;
      } else {
        EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
      }
    }
  }
  for (const auto& [what, bytes] :
       std::vector<std::pair<std::string, std::vector<uint8_t>>>{
           {"empty", {}},
           {"text", {'h', 'e', 'l', 'l', 'o'}},
           {"a GIF", {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0}},
       }) {
    absl::StatusOr<RgbImage> got = DecodeImage(bytes, what);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << what;
  }
}

TEST_F(ImageCodecTest, DimensionsPastTheLimitsAreRefusedBeforeAllocating) {
  if (PillowImages().empty()) GTEST_SKIP() << "python3-pil is not installed";
  // A PNG whose header claims 100000 x 100000 (CRC fixed up so that only the size is
  // wrong), and a JPEG whose SOF claims 60000 x 60000.
  std::vector<uint8_t> png = ReadBytes(PillowImages() / "rgb.png");
  auto be32 = [](uint8_t* p, uint32_t v) {
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
  };
  be32(&png[16], 100000);
  be32(&png[20], 100000);
  uint32_t crc = 0xFFFFFFFFu;  // CRC-32 of "IHDR" + its 13 data bytes
  for (size_t i = 12; i < 29; ++i) {
    crc ^= png[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  be32(&png[29], ~crc);
  absl::StatusOr<RgbImage> got = DecodeImage(png, "huge.png");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  std::vector<uint8_t> jpeg = ReadBytes(PillowImages() / "rgb-444.jpg");
  bool patched = false;
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && (jpeg[i + 1] == 0xC0 || jpeg[i + 1] == 0xC2)) {
      jpeg[i + 5] = 0xEA;  // height 60000
      jpeg[i + 6] = 0x60;
      jpeg[i + 7] = 0xEA;  // width 60000
      jpeg[i + 8] = 0x60;
      patched = true;
      break;
    }
  }
  ASSERT_TRUE(patched);
  got = DecodeImage(jpeg, "huge.jpg");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "outside")) << got.status();
}

}  // namespace
}  // namespace joule::worker
