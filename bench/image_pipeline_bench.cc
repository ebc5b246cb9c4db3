// joule-bench-images: decoded and augmented images per second through Joule's imagefolder:
// pipeline (image_batches.h), for bench/image_pipeline.sh to set beside torchvision's.
//
//   joule-bench-images DIR [--images N] [--threads T] [--size S] [--scale-min F]
//                          [--batch B] [--exact-decode]
//
// Prints one JSON line: {"pipeline": "joule", "images": N, "threads": T, "seconds": ...,
// "images_per_second": ..., "images_per_second_per_thread": ..., "cpu_seconds": ...}.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "worker/data/image_batches.h"
#include "worker/data/image_folder.h"

namespace {

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Joule's imagefolder: decode and augmentation throughput"};
  std::string dir;
  int64_t images = 2000;
  int threads = 1, size = 224, batch = 64;
  double scale_min = 0.08;
  bool exact = false;
  app.add_option("dir", dir, "an ImageFolder directory (train/CLASS/...)")->required();
  app.add_option("--images", images, "images to transform (cycling over the split)");
  app.add_option("--threads", threads, "decoding threads");
  app.add_option("--size", size, "RandomResizedCrop output side");
  app.add_option("--scale-min", scale_min, "RandomResizedCrop scale minimum (max 1)");
  app.add_option("--batch", batch, "images per batch");
  app.add_flag("--exact-decode", exact, "never decode JPEGs at reduced size");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);  // one core per decoding thread, as the reference's workers

  absl::StatusOr<joule::worker::ImageFolderSplits> folder =
      joule::worker::ScanImageFolder(dir, size, 0, 0);
  if (!folder.ok()) {
    std::cerr << "joule-bench-images: " << folder.status().message() << "\n";
    return 1;
  }
  joule::worker::ImageBatchOptions o;
  o.transform.size = size;
  o.transform.scale_min = scale_min;
  o.transform.exact_decode = exact;
  o.threads = threads;
  o.max_corrupt = 0;
  joule::worker::ImageBatchLoader loader(folder->train, o);
  const int64_t n = folder->train.size;
  // One warm-up batch (page cache, allocator), then the timed ones.
  std::vector<int64_t> warm;
  for (int64_t i = 0; i < std::min<int64_t>(batch, n); ++i) warm.push_back(i);
  if (absl::StatusOr<joule::worker::ImageBatchLoader::Batch> w = loader.Train(warm, 0); !w.ok()) {
    std::cerr << "joule-bench-images: " << w.status().message() << "\n";
    return 1;
  }
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t done = 0;
  for (int64_t epoch = 1; done < images; ++epoch) {
    std::vector<int64_t> idx;
    for (int64_t k = 0; k < batch && done + static_cast<int64_t>(idx.size()) < images; ++k) {
      idx.push_back((done + k) % n);
    }
    absl::StatusOr<joule::worker::ImageBatchLoader::Batch> b = loader.Train(idx, epoch);
    if (!b.ok()) {
      std::cerr << "joule-bench-images: " << b.status().message() << "\n";
      return 1;
    }
    done += static_cast<int64_t>(idx.size());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = CpuSeconds() - cpu0;
  std::printf(
      "{\"pipeline\": \"joule\", \"images\": %lld, \"threads\": %d, \"exact_decode\": %s, "
      "\"seconds\": %.3f, \"cpu_seconds\": %.3f, \"images_per_second\": %.1f, "
      "\"images_per_second_per_thread\": %.1f}\n",
      static_cast<long long>(done), threads, exact ? "true" : "false", seconds, cpu,
      static_cast<double>(done) / seconds, static_cast<double>(done) / seconds / threads);
  return 0;
}
