// The imagefolder: pipeline: the folder scan, torchvision's transforms, the batch loader.
#include <gtest/gtest.h>
#include <png.h>
#include <stdio.h>
// jpeglib.h after stdio.h
#include <jpeglib.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/data/image_batches.h"
#include "worker/data/image_folder.h"
#include "worker/data/image_transform.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;

// A fresh directory, removed at the end of the scope.
struct ScopedImageDir {
  fs::path path;
  explicit ScopedImageDir(const std::string& name)
      : path(fs::temp_directory_path() / absl::StrCat("joule-imgpipe-", name, "-", getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScopedImageDir() { fs::remove_all(path); }
};

// An 8-bit RGB PNG of width x height from f(x, y, c), written with libpng.
std::vector<uint8_t> Png(int width, int height, const std::function<uint8_t(int, int, int)>& f) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = PNG_FORMAT_RGB;
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < 3; ++c) pixels[(y * width + x) * 3 + c] = f(x, y, c);
    }
  }
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr);
  std::vector<uint8_t> out(size);
  EXPECT_TRUE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr));
  out.resize(size);
  return out;
}

// The same as a baseline JPEG (libjpeg, quality 92).
std::vector<uint8_t> Jpeg(int width, int height, const std::function<uint8_t(int, int, int)>& f) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < 3; ++c) pixels[(y * width + x) * 3 + c] = f(x, y, c);
    }
  }
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 92, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = pixels.data() + static_cast<size_t>(cinfo.next_scanline) * width * 3;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  free(buffer);
  return out;
}

void WriteFile(const fs::path& p, const std::vector<uint8_t>& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                           static_cast<std::streamsize>(bytes.size()));
}

// A folder with `classes` classes ("c0", "c1", ...) of `per_class` train and 2 val PNGs,
// each class a flat colour (class k: red = 20 k).
void MakeFolder(const fs::path& root, int classes, int per_class) {
  for (int k = 0; k < classes; ++k) {
    const auto colour = [k](int, int, int c) { return static_cast<uint8_t>(c == 0 ? 20 * k : 50); };
    for (int i = 0; i < per_class; ++i) {
      WriteFile(root / "train" / absl::StrCat("c", k) / absl::StrCat(i, ".png"), Png(24, 20, colour));
    }
    for (int i = 0; i < 2; ++i) {
      WriteFile(root / "val" / absl::StrCat("c", k) / absl::StrCat(i, ".PNG"), Png(24, 20, colour));
    }
  }
}

TEST(ImageFolderTest, ScansClassesInByteOrderAndWritesThenChecksTheClassIndex) {
  ScopedImageDir dir("scan");
  MakeFolder(dir.path, 3, 4);
  WriteFile(dir.path / "train" / "c1" / "notes.txt", {'x'});  // ignored
  absl::StatusOr<ImageFolderSplits> s = ScanImageFolder(dir.path.string(), 32, 0, 0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->class_names, (std::vector<std::string>{"c0", "c1", "c2"}));
  EXPECT_EQ(s->train.size, 12);
  EXPECT_EQ(s->test.size, 6);
  EXPECT_EQ(s->train.labels[4], 1);
  EXPECT_TRUE(absl::EndsWith(s->train.files[4], "train/c1/0.png")) << s->train.files[4];
  EXPECT_EQ(s->train.channels, 3);
  EXPECT_EQ(s->train.height, 32);
  EXPECT_EQ(s->train.classes, 3);
  std::ifstream index(dir.path / "classes.txt");
  std::string text((std::istreambuf_iterator<char>(index)), {});
  EXPECT_EQ(text, "c0\nc1\nc2\n");
  // A class added later would renumber the labels: refused, naming the file.
  fs::create_directories(dir.path / "train" / "c05");
  s = ScanImageFolder(dir.path.string(), 32, 0, 0);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "classes.txt gives class 1 as \"c1\""))
      << s.status();
  fs::remove(dir.path / "train" / "c05");
  // A validation class the training split lacks.
  WriteFile(dir.path / "val" / "zebra" / "0.png", Png(4, 4, [](int, int, int) { return 0; }));
  s = ScanImageFolder(dir.path.string(), 32, 0, 0);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  // Limits keep every class's share.
  fs::remove_all(dir.path / "val" / "zebra");
  s = ScanImageFolder(dir.path.string(), 32, 6, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->train.labels, (std::vector<int64_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(s->test.labels, (std::vector<int64_t>{0, 1, 2}));
  // A stratified 1/2 of a file-backed split.
  s = ScanImageFolder(dir.path.string(), 32, 0, 0);
  KeepStratifiedFraction(s->train, 2);
  EXPECT_EQ(s->train.size, 6);
  EXPECT_EQ(s->train.files.size(), 6u);
  EXPECT_TRUE(absl::EndsWith(s->train.files[1], "train/c0/2.png")) << s->train.files[1];
}

TEST(ImageFolderTest, MissingOrEmptyLayoutsAreClearErrors) {
  ScopedImageDir dir("layout");
  EXPECT_EQ(ScanImageFolder(dir.path.string(), 32, 0, 0).status().code(),
            absl::StatusCode::kNotFound);
  fs::create_directories(dir.path / "train");
  fs::create_directories(dir.path / "val");
  EXPECT_EQ(ScanImageFolder(dir.path.string(), 32, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  fs::create_directories(dir.path / "train" / "a");
  absl::StatusOr<ImageFolderSplits> s = ScanImageFolder(dir.path.string(), 32, 0, 0);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "has no .jpg, .jpeg or .png images"));
}

ImageTransformOptions Options(double scale_min, double scale_max) {
  ImageTransformOptions o;
  o.size = 16;
  o.scale_min = scale_min;
  o.scale_max = scale_max;
  o.mean = {0, 0, 0};
  o.std = {1, 1, 1};
  return o;
}

TEST(ImageTransformTest, CropBoxesFollowTorchvisionsDistribution) {
  // Over many draws on a 200 x 100 image: every box inside it, its area fraction in the
  // scale range and its ratio in the ratio range (up to rounding) whenever a try
  // succeeded, the offsets uniform over what fits; the same key gives the same box.
  const ImageTransformOptions o = Options(0.25, 0.5);
  double mean_fraction = 0;
  int fallbacks = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    ExampleRng rng(3, 1, i);
    const CropBox b = RandomResizedCropBox(200, 100, o, rng);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, 100);
    ASSERT_LE(b.left + b.width, 200);
    const double fraction = double(b.width) * b.height / (200.0 * 100.0);
    const double ratio = double(b.width) / b.height;
    if (b.width == 133 && b.height == 100) {  // the centre fallback at ratio 4/3
      ++fallbacks;
      continue;
    }
    EXPECT_GE(fraction, 0.25 * 0.95) << i;
    EXPECT_LE(fraction, 0.5 * 1.05) << i;
    EXPECT_GE(ratio, 0.75 * 0.95) << i;
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.05) << i;
    mean_fraction += fraction;
    ExampleRng again(3, 1, i);
    EXPECT_EQ(RandomResizedCropBox(200, 100, o, again), b);
  }
  mean_fraction /= n - fallbacks;
  // Tall boxes do not fit 100 rows: the tries keep the smaller ones more often.
  EXPECT_LT(mean_fraction, 0.375);
  EXPECT_LT(fallbacks, n / 100);
  // On a square image every try fits: the area fraction is uniform in [0.25, 0.5].
  double square_mean = 0;
  for (int i = 0; i < n; ++i) {
    ExampleRng rng(4, 0, i);
    const CropBox b = RandomResizedCropBox(200, 200, o, rng);
    square_mean += double(b.width) * b.height / 40000.0;
  }
  EXPECT_NEAR(square_mean / n, 0.375, 0.005);
  // An image far narrower than any allowed ratio: every try fails, the centre crop at
  // the nearest ratio (3/4) is taken.
  ExampleRng rng(1, 0, 0);
  // (h = round(10 / 0.75) = 13, centred: top (400 - 13) / 2 = 193.)
  EXPECT_EQ(RandomResizedCropBox(10, 400, Options(0.9, 1.0), rng), (CropBox{193, 0, 13, 10}));
  // The extremes the spec allows (ratios 0.01..100) on a one-pixel-wide image: a box of at
  // least one pixel inside it, never an overflow.
  ImageTransformOptions wide = Options(0.08, 1.0);
  wide.ratio_min = 50;
  wide.ratio_max = 100;
  for (int i = 0; i < 50; ++i) {
    ExampleRng r(2, 0, i);
    const CropBox b = RandomResizedCropBox(1, 400, wide, r);
    EXPECT_GE(b.height, 1);
    EXPECT_GE(b.width, 1);
    EXPECT_LE(b.top + b.height, 400);
    EXPECT_LE(b.left + b.width, 1);
  }
}

TEST(ImageTransformTest, KeysGiveTheSameDrawsAndDifferentKeysDifferentOnes) {
  ExampleRng a(7, 2, 11), b(7, 2, 11), c(7, 3, 11), d(8, 2, 11), e(7, 2, 12);
  const uint64_t first = a.Next();
  EXPECT_EQ(first, b.Next());
  for (ExampleRng* other : {&c, &d, &e}) EXPECT_NE(first, other->Next());
  ExampleRng u(1, 1, 1);
  double sum = 0;
  int flips = 0;
  for (int i = 0; i < 10000; ++i) {
    const double v = u.Uniform(0, 1);
    ASSERT_GE(v, 0);
    ASSERT_LT(v, 1);
    sum += v;
    flips += u.Uniform(0, 1) < 0.5;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
  EXPECT_NEAR(flips / 10000.0, 0.5, 0.02);
}

TEST(ImageTransformTest, TrainAndEvalTransformsGiveNormalisedTensorsOfTheSide) {
  // Left half dark, right half bright: a flip shows as which half is dark.
  const std::vector<uint8_t> png = Png(64, 64, [](int x, int, int) {
    return static_cast<uint8_t>(x < 32 ? 0 : 255);
  });
  ImageTransformOptions o = Options(1.0, 1.0);
  o.ratio_min = o.ratio_max = 1.0;  // the whole image, resized to 16 x 16
  int flipped = 0;
  for (int i = 0; i < 200; ++i) {
    ExampleRng rng(5, 0, i);
    absl::StatusOr<torch::Tensor> x = TrainTransform(png, "half.png", o, rng);
    ASSERT_TRUE(x.ok()) << x.status();
    ASSERT_EQ(x->sizes(), (std::vector<int64_t>{3, 16, 16}));
    const float left = (*x)[0][8][0].item<float>(), right = (*x)[0][8][15].item<float>();
    EXPECT_NEAR(std::min(left, right), 0.0f, 1e-6);
    EXPECT_NEAR(std::max(left, right), 1.0f, 1e-6);  // ToTensor: 255 -> 1
    flipped += left > right;
  }
  EXPECT_GT(flipped, 70);
  EXPECT_LT(flipped, 130);
  o.hflip = false;
  ExampleRng rng(5, 0, 0);
  absl::StatusOr<torch::Tensor> unflipped = TrainTransform(png, "half.png", o, rng);
  EXPECT_LT((*unflipped)[1][3][0].item<float>(), 0.5f);
  // ImageNet normalisation: (v - mean) / std per channel.
  ImageTransformOptions imagenet;
  imagenet.size = 16;
  imagenet.eval_resize = 18;
  const std::vector<uint8_t> grey = Png(40, 30, [](int, int, int) { return uint8_t{128}; });
  absl::StatusOr<torch::Tensor> e = EvalTransform(grey, "grey.png", imagenet);
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e->sizes(), (std::vector<int64_t>{3, 16, 16}));
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR((*e)[c][5][5].item<float>(), (128 / 255.0f - imagenet.mean[c]) / imagenet.std[c],
                1e-5);
  }
}

TEST(ImageTransformTest, TheCheapDecodeIsCloseToTheExactOne) {
  // A smooth 300 x 240 image, cut and resized to 16 x 16: decoded as a JPEG at 1/2..1/8
  // size in the DCT domain it transforms to nearly what the full-size decode gives (the
  // draws are the same: the box is drawn on the full size); as a PNG (no DCT) to exactly
  // the same.
  const auto smooth = [](int x, int y, int c) {
    return static_cast<uint8_t>(127 + 100 * std::sin(0.03 * x + c) * std::cos(0.02 * y));
  };
  const std::vector<uint8_t> png = Png(300, 240, smooth), jpeg = Jpeg(300, 240, smooth);
  ImageTransformOptions fast = Options(0.5, 1.0), exact = fast;
  exact.exact_decode = true;
  double jpeg_mean_diff = 0;
  for (int i = 0; i < 20; ++i) {
    for (const auto* bytes : {&png, &jpeg}) {
      ExampleRng r1(9, 0, i), r2(9, 0, i);
      absl::StatusOr<torch::Tensor> a = TrainTransform(*bytes, "a", fast, r1);
      absl::StatusOr<torch::Tensor> b = TrainTransform(*bytes, "a", exact, r2);
      ASSERT_TRUE(a.ok() && b.ok());
      if (bytes == &png) {
        EXPECT_TRUE(torch::equal(*a, *b)) << i;
      } else {
        jpeg_mean_diff += (*a - *b).abs().mean().item<double>() / 20;
        EXPECT_LT((*a - *b).abs().max().item<double>(), 0.1) << i;
      }
    }
  }
  // Mean 0.014 of a [0, 1] range measured (the box snaps to the scaled pixel grid).
  EXPECT_LT(jpeg_mean_diff, 0.02);
  EXPECT_GT(jpeg_mean_diff, 0) << "the cheap decode was not taken";
}

TEST(ImageBatchLoaderTest, BatchesAreDeterministicAndCorruptFilesAreSkippedUpToTheLimit) {
  ScopedImageDir dir("loader");
  MakeFolder(dir.path, 4, 6);
  absl::StatusOr<ImageFolderSplits> s = ScanImageFolder(dir.path.string(), 16, 0, 0);
  ASSERT_TRUE(s.ok()) << s.status();
  ImageBatchOptions o;
  o.transform = Options(0.3, 1.0);
  o.seed = 4;
  o.max_corrupt = 2;
  ImageBatchOptions four = o;
  four.threads = 4;
  ImageBatchLoader one_thread(s->train, o), threaded(s->train, four);
  const std::vector<int64_t> idx = {0, 5, 7, 12, 23, 3};
  absl::StatusOr<ImageBatchLoader::Batch> a = one_thread.Train(idx, 2);
  absl::StatusOr<ImageBatchLoader::Batch> b = threaded.Train(idx, 2);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_TRUE(torch::equal(a->first, b->first)) << "threads change nothing";
  EXPECT_EQ(a->second[3].item<int64_t>(), 2);  // example 12: class c2
  // An example's crop does not depend on its batch; it does on the epoch.
  absl::StatusOr<ImageBatchLoader::Batch> alone = threaded.Train({12}, 2);
  EXPECT_TRUE(torch::equal(alone->first[0], a->first[3]));
  // Class colours survive the transform: red = 20 k / 255 (flat images).
  EXPECT_NEAR(a->first[3][0][4][4].item<float>(), 40 / 255.0f, 1e-5);

  // Corrupt files: the slot takes the batch's next good example; counted once each.
  WriteFile(s->train.files[5], {'n', 'o', 'p', 'e'});
  std::vector<uint8_t> truncated = Png(24, 20, [](int, int, int) { return uint8_t{9}; });
  truncated.resize(truncated.size() / 2);
  WriteFile(s->train.files[7], truncated);
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<ImageBatchLoader::Batch> c = threaded.Train(idx, 2);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->first.size(0), 6);
    EXPECT_TRUE(torch::equal(c->first[1], c->first[3])) << "slot 1 takes slot 3's example";
    EXPECT_EQ(c->second[1].item<int64_t>(), c->second[3].item<int64_t>());
    EXPECT_EQ(threaded.corrupt_files(), 2);
  }
  // The paper's quirk: evaluation through the training pipeline, the same draws every time.
  ImageBatchOptions quirk = o;
  quirk.transform.eval_uses_train_transform = true;
  ImageBatchLoader q(s->train, quirk);
  absl::StatusOr<ImageBatchLoader::Batch> q1 = q.Eval({2, 3}), q2 = q.Eval({3});
  ASSERT_TRUE(q1.ok() && q2.ok());
  EXPECT_TRUE(torch::equal(q1->first[1], q2->first[0]));
  ExampleRng fixed(o.seed, -1, 3);
  absl::StatusOr<torch::Tensor> direct =
      TrainTransform(ReadWholeFile(s->train.files[3], OpenPlain, 1 << 20).value(),
                     "x", quirk.transform, fixed);
  EXPECT_TRUE(torch::equal(q2->first[0], *direct));
  // Evaluation leaves them out.
  absl::StatusOr<ImageBatchLoader::Batch> e = threaded.Eval({4, 5, 6, 7});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->first.size(0), 2);
  EXPECT_EQ(e->second.size(0), 2);
  // One more distinct failure passes the limit of 2: the job fails, naming the file.
  fs::remove(s->train.files[0]);
  absl::StatusOr<ImageBatchLoader::Batch> over = threaded.Train(idx, 3);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(over.status().message(), "more than max_corrupt_images 2"))
      << over.status();
  // A batch with no good example at all.
  ImageBatchOptions lenient = o;
  lenient.max_corrupt = 100;
  ImageBatchLoader l(s->train, lenient);
  absl::StatusOr<ImageBatchLoader::Batch> none = l.Train({5, 7}, 0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace joule::worker
