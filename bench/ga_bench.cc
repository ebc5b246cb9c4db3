// Genetic-algorithm throughput: generations per second and fitness evaluations per second
// of one island (worker/train/ga.h) on Fashion-MNIST-shaped data (784 features, 10
// classes, random values: throughput does not depend on them), for logistic regression
// (--hidden 0) and mlps of one hidden layer, in three forms side by side:
//   serial        the products of one individual at a time (GaIsland::FitnessOneByOne;
//                 logreg: a [B, 784] x [784, 10] GEMM each), 1 thread: the baseline, as a
//                 GA written one individual at a time;
//   batched       the whole population's first layer in one [B, 784] x [784, P*width]
//                 GEMM, later layers in one batched product (GaIsland::Fitness), 1 thread;
//   batched xT    the same on T intra-op threads (--threads, default: the cores).
// A generation is a fitness on a batch of B examples, then selection and variation
// (GaIsland::Evolve, the same in every form). A fitness evaluation is one individual scored
// on the batch. Each form runs at least --seconds (after one warm-up generation).
//
// usage: joule-bench-ga [--hidden 0,64] [--populations 64,256,1024] [--batches 256,1024]
//                       [--threads T] [--seconds 1]
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "worker/train/ga.h"
#include "worker/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Rate {
  double generations_per_second = 0;
  double evaluations_per_second = 0;
};

Rate Measure(int64_t hidden, int64_t population, int64_t batch, bool batched, double seconds) {
  joule::v1::GaSpec spec;
  spec.set_population(static_cast<int32_t>(population));
  spec.set_mutation_rate(0.05);
  spec.set_mutation_scale(0.05);
  spec.set_crossover_rate(0.5);
  spec.set_elite(2);
  spec.set_fitness_batch(static_cast<int32_t>(batch));
  std::vector<int64_t> layers = {784, 10};
  if (hidden > 0) layers = {784, hidden, 10};
  joule::worker::GaIsland island(layers, spec, /*seed=*/1, /*rank=*/0);
  torch::Generator g = at::make_generator<at::CPUGeneratorImpl>(2);
  const torch::Tensor x = torch::randn({batch, 784}, g);
  const torch::Tensor y = torch::randint(10, {batch}, g, torch::kLong);
  auto generation = [&] {
    island.Evolve(batched ? island.Fitness(x, y) : island.FitnessOneByOne(x, y));
  };
  generation();  // warm-up
  int64_t n = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    generation();
    ++n;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return {n / elapsed, n * population / elapsed};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "joule-bench-ga: genetic-algorithm generations/s and fitness evaluations/s, "
      "serial against batched");
  std::vector<int64_t> hiddens = {0, 64}, populations = {64, 256, 1024}, batches = {256, 1024};
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double seconds = 1;
  app.add_option("--hidden", hiddens, "models: 0 is logreg, H an mlp of one hidden layer of H")
      ->delimiter(',');
  app.add_option("--populations", populations, "island populations")->delimiter(',');
  app.add_option("--batches", batches, "fitness batches (examples)")->delimiter(',');
  app.add_option("--threads", threads, "intra-op threads of the last form")
      ->check(CLI::Range(1, 256));
  app.add_option("--seconds", seconds, "at least this long per form")
      ->check(CLI::Range(0.01, 600.0));
  CLI11_PARSE(app, argc, argv);
  std::printf("%-8s %10s %6s  %22s  %22s  %22s  %8s %8s\n", "model", "population", "batch",
              "serial gen/s (eval/s)", "batched gen/s (eval/s)",
              ("batched x" + std::to_string(threads) + " gen/s (eval/s)").c_str(), "batch/ser",
              "xT/ser");
  for (int64_t h : hiddens) {
    for (int64_t p : populations) {
      for (int64_t b : batches) {
        joule::worker::SetIntraOpThreads(1);
        const Rate serial = Measure(h, p, b, false, seconds);
        const Rate batched = Measure(h, p, b, true, seconds);
        joule::worker::SetIntraOpThreads(threads);
        const Rate parallel = Measure(h, p, b, true, seconds);
        auto cell = [](const Rate& r) {
          char text[64];
          std::snprintf(text, sizeof text, "%8.1f (%10.0f)", r.generations_per_second,
                        r.evaluations_per_second);
          return std::string(text);
        };
        const std::string model = h > 0 ? "mlp-" + std::to_string(h) : "logreg";
        std::printf("%-8s %10lld %6lld  %22s  %22s  %22s  %7.2fx %7.2fx\n", model.c_str(),
                    static_cast<long long>(p), static_cast<long long>(b), cell(serial).c_str(),
                    cell(batched).c_str(), cell(parallel).c_str(),
                    batched.generations_per_second / serial.generations_per_second,
                    parallel.generations_per_second / serial.generations_per_second);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
