#include "worker/train/ga.h"

#include <ATen/CPUGeneratorImpl.h>
#include <zlib.h>

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "spdlog/spdlog.h"
#include "worker/energy/phase_clock.h"
#include "worker/train/checkpoint.h"
#include "worker/train/progress_reporter.h"
#include "worker/train/resume_point.h"

namespace joule::worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The generator's seed for (seed, rank) and, from the run, a generation: splitmix64 steps
// (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014), so
// that nearby inputs give unrelated streams.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
uint64_t StreamSeed(uint64_t seed, int rank, int64_t generation) {
  return Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(rank)) ^ static_cast<uint64_t>(generation));
}

// Fair coin flips of `shape`, 30 from each 30-bit draw of the generator (one draw per
// weight, as a uniform per weight would take, made a third of Evolve's time).
torch::Tensor RandomBits(c10::IntArrayRef shape, torch::Generator& generator) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t draws = (n + 29) / 30;
  const torch::Tensor words = torch::randint(int64_t{1} << 30, {draws, 1}, generator, torch::kLong);
  const torch::Tensor bits = torch::bitwise_and(
      torch::bitwise_right_shift(words, torch::arange(30, torch::kLong)), 1);
  return bits.reshape({-1}).narrow(0, 0, n).to(torch::kBool).reshape(shape);
}

// The indices in [0, n) where independent Bernoulli(p) trials succeed, ascending: the gaps
// between successes of a Bernoulli process are Geometric(p) on {1, 2, ...}, so about p x n
// draws stand for n trials (the same distribution as a uniform per trial, drawn ~1/p
// times faster).
torch::Tensor BernoulliPositions(int64_t n, double p, torch::Generator& generator) {
  if (p <= 0 || n == 0) return torch::empty({0}, torch::kLong);
  if (p >= 1) return torch::arange(n, torch::kLong);
  std::vector<torch::Tensor> parts;
  int64_t next = 0;  // the first trial not yet decided
  while (next < n) {
    const double mean = p * static_cast<double>(n - next);
    const auto m = static_cast<int64_t>(mean + 6 * std::sqrt(mean) + 16);
    torch::Tensor gaps = torch::empty({m}, torch::kDouble).geometric_(p, generator);
    torch::Tensor at = gaps.to(torch::kLong).cumsum(0) + (next - 1);
    const int64_t last = at[m - 1].item<int64_t>();
    parts.push_back(at.masked_select(at < n));
    next = last + 1;
  }
  return torch::cat(parts);
}

// An island's population as one flat float buffer: weights, then bias.
torch::Tensor FlatPopulation(const GaIsland& island) {
  return torch::cat({island.weights().reshape({-1}), island.bias()}).contiguous();
}

// Before generation `generation`: every island to rank 0, which writes them. Collective.
// A write that fails is logged (the run goes on); a failed gather is the run's error.
absl::Status SaveGaCheckpoint(const v1::Assignment& a, ProcessGroup& pg, const GaIsland& island,
                              const std::string& dir, int64_t generation,
                              PhaseClock* phases) {
  ScopedPhase phase(phases, Phase::kCheckpoint);
  const torch::Tensor mine = FlatPopulation(island);
  const int64_t n = mine.numel();
  std::vector<float> all(static_cast<size_t>(n * pg.size()));
  if (absl::Status s = pg.Allgather(std::span<const float>(mine.data_ptr<float>(), n),
                                    std::span<float>(all));
      !s.ok()) {
    return s;
  }
  if (pg.rank() != 0) return absl::OkStatus();
  v1::Checkpoint c;
  c.set_format_version(1);
  c.set_spec_hash(SpecHash(a.spec()));
  c.set_job_id(a.job_id());
  c.set_attempt(a.attempt());
  c.set_next_epoch(0);
  c.set_next_step_in_epoch(generation);
  c.set_global_step(generation);
  c.set_test_accuracy(-1);
  const int64_t w = island.weights().numel();
  for (int r = 0; r < pg.size(); ++r) {
    const float* base = all.data() + static_cast<size_t>(r) * n;
    v1::TensorData* weights = c.add_parameters();
    weights->set_name(absl::StrCat("island.", r, ".weights"));
    for (int64_t d : island.weights().sizes()) weights->add_shape(d);
    weights->mutable_values()->Add(base, base + w);
    v1::TensorData* bias = c.add_parameters();
    bias->set_name(absl::StrCat("island.", r, ".bias"));
    bias->add_shape(island.bias().numel());
    bias->mutable_values()->Add(base + w, base + n);
  }
  if (absl::Status s = WriteCheckpoint(dir, c, a.spec().keep_checkpoints()); !s.ok()) {
    spdlog::warn("job {}: ga checkpoint at generation {} failed: {}", a.job_id(), generation,
                 s.ToString());
  }
  return absl::OkStatus();
}

// Rank 0: the newest checkpoint of this job that holds one island per rank in this run's
// shapes, as one flat buffer (island after island, FlatPopulation's layout); nullopt when
// there is none (unusable files logged).
std::optional<std::vector<float>> LoadGaCheckpoint(const v1::Assignment& a,
                                                   const GaIsland& island,
                                                   const std::string& dir, int64_t* generation) {
  if (dir.empty()) return std::nullopt;
  std::vector<std::string> skipped;
  absl::StatusOr<v1::Checkpoint> c = LoadNewestCheckpoint(dir, SpecHash(a.spec()), &skipped);
  for (const std::string& why : skipped) spdlog::warn("job {}: skipping {}", a.job_id(), why);
  if (!c.ok()) return std::nullopt;
  const int64_t w = island.weights().numel(), b = island.bias().numel();
  std::vector<float> flat;
  flat.reserve(static_cast<size_t>((w + b) * a.world_size()));
  bool fits = c->parameters_size() == 2 * a.world_size() && c->global_step() >= 0 &&
              c->global_step() <= a.spec().ga().generations();
  for (int i = 0; fits && i < c->parameters_size(); ++i) {
    const v1::TensorData& t = c->parameters(i);
    const std::string name = absl::StrCat("island.", i / 2, i % 2 == 0 ? ".weights" : ".bias");
    fits = t.name() == name && t.values_size() == (i % 2 == 0 ? w : b);
    if (fits) flat.insert(flat.end(), t.values().begin(), t.values().end());
  }
  if (!fits) {
    spdlog::warn("job {}: the newest checkpoint (generation {}) does not hold this run's "
                 "islands; starting from generation 0",
                 a.job_id(), c->global_step());
    return std::nullopt;
  }
  *generation = c->global_step();
  return flat;
}

// Every rank's island from rank 0's checkpoint, if it has one: returns the generation to
// run next (0: none). Collective.
absl::StatusOr<int64_t> ResumeIslands(const v1::Assignment& a, ProcessGroup& pg,
                                      GaIsland& island, const std::string& dir) {
  std::optional<std::vector<float>> flat;
  std::optional<ResumePoint> point;
  if (pg.rank() == 0) {
    int64_t generation = 0;
    flat = LoadGaCheckpoint(a, island, dir, &generation);
    if (flat) point = ResumePoint{.global_step = generation};
  }
  if (absl::Status s = BroadcastResumePoint(pg, 0, &point); !s.ok()) return s;
  if (!point) return 0;
  const int64_t n = island.weights().numel() + island.bias().numel();
  if (!flat) flat.emplace(static_cast<size_t>(n * pg.size()));
  if (absl::Status s = pg.Broadcast(std::span<float>(*flat), 0); !s.ok()) return s;
  torch::Tensor mine = torch::from_blob(flat->data() + static_cast<size_t>(pg.rank()) * n, {n},
                                        torch::kFloat32);
  const int64_t w = island.weights().numel();
  if (absl::Status s = island.SetPopulation(mine.narrow(0, 0, w).reshape(island.weights().sizes()),
                                            mine.narrow(0, w, n - w));
      !s.ok()) {
    return s;
  }
  return point->global_step;
}

}  // namespace

GaIsland::GaIsland(int64_t features, int64_t classes, const v1::GaSpec& spec, uint64_t seed,
                   int rank)
    : features_(features),
      classes_(classes),
      population_(spec.population()),
      spec_(spec),
      generator_(at::make_generator<at::CPUGeneratorImpl>(StreamSeed(seed, rank, -1))) {
  // Small random weights, as nn.Linear's scale 1/sqrt(features).
  const double scale = 1.0 / std::sqrt(static_cast<double>(features));
  weights_ = torch::randn({features, population_ * classes}, generator_) * scale;
  bias_ = torch::zeros({population_ * classes});
}

void GaIsland::Reseed(uint64_t seed, int rank, int64_t generation) {
  generator_.set_current_seed(StreamSeed(seed, rank, generation));
}

absl::Status GaIsland::SetPopulation(const torch::Tensor& weights, const torch::Tensor& bias) {
  if (weights.sizes() != weights_.sizes() || bias.sizes() != bias_.sizes()) {
    return absl::InvalidArgumentError("the population's shapes differ from this island's");
  }
  weights_ = weights.to(torch::kFloat32).clone().contiguous();
  bias_ = bias.to(torch::kFloat32).clone().contiguous();
  return absl::OkStatus();
}

torch::Tensor GaIsland::FitnessOneByOne(const torch::Tensor& x, const torch::Tensor& y) const {
  const int64_t b = x.size(0);
  const torch::Tensor flat = x.reshape({b, features_});
  torch::Tensor fitness = torch::empty({population_});
  for (int64_t p = 0; p < population_; ++p) {
    const torch::Tensor logits = torch::addmm(bias_.narrow(0, p * classes_, classes_), flat,
                                              weights_.narrow(1, p * classes_, classes_));
    fitness[p] = logits.argmax(1).eq(y).to(torch::kFloat32).mean();
  }
  return fitness;
}

torch::Tensor GaIsland::Fitness(const torch::Tensor& x, const torch::Tensor& y) const {
  const int64_t b = x.size(0);
  torch::Tensor logits = torch::addmm(bias_, x.reshape({b, features_}), weights_)
                             .reshape({b, population_, classes_});
  torch::Tensor predicted = logits.argmax(2);                         // [B, P]
  return predicted.eq(y.reshape({b, 1})).to(torch::kFloat32).mean(0);  // [P]
}

std::pair<torch::Tensor, torch::Tensor> GaIsland::Individual(int64_t p) const {
  torch::Tensor w = weights_.narrow(1, p * classes_, classes_).t().contiguous();
  torch::Tensor b = bias_.narrow(0, p * classes_, classes_).clone();
  return {w, b};
}

void GaIsland::SetIndividual(int64_t p, const torch::Tensor& weight, const torch::Tensor& bias) {
  weights_.narrow(1, p * classes_, classes_).copy_(weight.t());
  bias_.narrow(0, p * classes_, classes_).copy_(bias);
}

void GaIsland::Evolve(const torch::Tensor& fitness) {
  const int64_t p = population_, c = classes_;
  // Evolved in place of the GEMM's layout (weights [features, P, C], bias [P, C]): an
  // individual is a column block, chosen with index_select along dimension 1 (no
  // transposed copy of the population).
  const torch::Tensor weights = weights_.view({features_, p, c});
  const torch::Tensor bias = bias_.view({p, c});
  torch::Tensor order = torch::argsort(fitness, /*stable=*/true, 0, /*descending=*/true);
  const int64_t elite = spec_.elite();
  const int64_t children = p - elite;
  // Tournaments of two for both parents of every child.
  torch::Tensor a = torch::randint(p, {children, 2}, generator_, torch::kLong);
  torch::Tensor b = torch::randint(p, {children, 2}, generator_, torch::kLong);
  torch::Tensor first = torch::where(fitness.index({a.select(1, 0)}) >= fitness.index({a.select(1, 1)}),
                                     a.select(1, 0), a.select(1, 1));
  torch::Tensor second = torch::where(fitness.index({b.select(1, 0)}) >= fitness.index({b.select(1, 1)}),
                                      b.select(1, 0), b.select(1, 1));
  // Uniform crossover for the children chosen to mix, weight by weight.
  const torch::Tensor mixes = torch::rand({children}, generator_) < spec_.crossover_rate();
  auto cross = [&](const torch::Tensor& genes, int64_t dim) {  // dim: the individuals'
    torch::Tensor mother = genes.index_select(dim, first), father = genes.index_select(dim, second);
    std::vector<int64_t> per_child(static_cast<size_t>(mother.dim()), 1);
    per_child[static_cast<size_t>(dim)] = children;
    const torch::Tensor take = mixes.view(per_child).logical_and(RandomBits(mother.sizes(), generator_));
    return torch::where(take, father, mother);
  };
  torch::Tensor child_w = cross(weights, 1), child_b = cross(bias, 0);
  // Gaussian mutation, where a Bernoulli(mutation_rate) trial per weight succeeds.
  for (torch::Tensor* genes : {&child_w, &child_b}) {
    const torch::Tensor at = BernoulliPositions(genes->numel(), spec_.mutation_rate(), generator_);
    if (at.numel() == 0) continue;
    genes->view({-1}).index_add_(
        0, at, torch::randn({at.numel()}, generator_) * spec_.mutation_scale());
  }
  const torch::Tensor keep = order.narrow(0, 0, elite);
  weights_ = torch::cat({weights.index_select(1, keep), child_w}, 1).reshape({features_, p * c});
  bias_ = torch::cat({bias.index_select(0, keep), child_b}, 0).reshape({p * c});
}

absl::Status GaIsland::Migrate(ProcessGroup& pg, torch::Tensor& fitness) {
  const int64_t k = spec_.migration_size();
  const int world = pg.size();
  if (k <= 0 || world < 2) return absl::OkStatus();
  torch::Tensor order = torch::argsort(fitness, /*stable=*/true, 0, /*descending=*/true);
  // Each migrant: its weights, its bias, its fitness.
  const int64_t genome = (features_ + 1) * classes_, row = genome + 1;
  torch::Tensor mine = torch::empty({k, row});
  for (int64_t i = 0; i < k; ++i) {
    const int64_t p = order[i].item<int64_t>();
    auto [w, b] = Individual(p);
    mine[i] = torch::cat({w.reshape({-1}), b, fitness[p].reshape({1})});
  }
  std::vector<float> all(static_cast<size_t>(world * k * row));
  if (absl::Status s = pg.Allgather(std::span<const float>(mine.data_ptr<float>(), k * row),
                                    std::span<float>(all));
      !s.ok()) {
    return s;
  }
  // The previous rank's best replace this island's worst, with their fitness.
  const int from = (pg.rank() + world - 1) % world;
  torch::Tensor incoming =
      torch::from_blob(all.data() + static_cast<size_t>(from * k * row), {k, row},
                       torch::kFloat32)
          .clone();
  for (int64_t i = 0; i < k; ++i) {
    const int64_t worst = order[population_ - 1 - i].item<int64_t>();
    torch::Tensor g = incoming[i];
    SetIndividual(worst, g.narrow(0, 0, features_ * classes_).reshape({classes_, features_}),
                  g.narrow(0, features_ * classes_, classes_));
    fitness[worst] = g[genome];
  }
  return absl::OkStatus();
}

absl::Status RunGeneticAlgorithm(const v1::Assignment& a, const TrainHooks& hooks,
                                 ProcessGroup& pg, const std::string& checkpoint_dir,
                                 int64_t classes, const torch::Tensor& train_x,
                                 const torch::Tensor& train_y, const torch::Tensor& test_x,
                                 const torch::Tensor& test_y, v1::RankResult& result) {
  const v1::JobSpec& spec = a.spec();
  const v1::GaSpec& ga = spec.ga();
  const auto start = std::chrono::steady_clock::now();
  const int64_t features = train_x[0].numel();
  const torch::Tensor x = train_x.reshape({train_x.size(0), features});
  // Checked alike on every rank: none may wait in a collective for one that returned.
  if (x.size(0) < a.world_size()) {
    return absl::InvalidArgumentError("the training split has fewer examples than ranks");
  }
  // This rank's strided shard of the training split (every world-th example).
  const torch::Tensor shard = torch::arange(a.rank(), x.size(0), a.world_size(), torch::kLong);
  // The job's population split over the islands (the spec checks it divides).
  v1::GaSpec island_spec = ga;
  island_spec.set_population(ga.population() / std::max(1, a.world_size()));
  GaIsland island(features, classes, island_spec, spec.seed(), a.rank());
  absl::StatusOr<int64_t> first = ResumeIslands(a, pg, island, checkpoint_dir);
  if (!first.ok()) return first.status();
  if (*first > 0) {
    result.set_resumed_from_step(*first);
    if (a.rank() == 0) {
      spdlog::info("job {}: resuming the ga at generation {}", a.job_id(), *first);
    }
  }
  const int64_t batch = std::min<int64_t>(ga.fitness_batch(), shard.numel());
  ProgressReporter progress(hooks.on_progress, 1.0, batch, ga.generations(), *first, -1,
                            *joule::Clock::Real(), start);
  progress.SetEpoch(1);
  const int64_t every = checkpoint_dir.empty() ? 0 : spec.checkpoint_every_steps();
  torch::Tensor fitness;
  int64_t g = *first;
  for (; g < ga.generations(); ++g) {
    if (hooks.cancelled && hooks.cancelled()) {
      result.set_cancelled(true);
      break;
    }
    if (every > 0 && g > *first && g % every == 0) {
      if (absl::Status s = SaveGaCheckpoint(a, pg, island, checkpoint_dir, g, hooks.phases);
          !s.ok()) {
        return s;
      }
    }
    island.Reseed(spec.seed(), a.rank(), g);
    const auto step_start = std::chrono::steady_clock::now();
    if (hooks.phases) hooks.phases->Enter(Phase::kForward);
    torch::Tensor pick =
        shard.index({torch::randint(shard.numel(), {batch}, island.generator(), torch::kLong)});
    fitness = island.Fitness(x.index({pick}), train_y.index({pick}));
    const bool last = g + 1 == ga.generations();
    if (ga.migration_interval() > 0 && (g + 1) % ga.migration_interval() == 0 && !last) {
      if (hooks.phases) hooks.phases->Enter(Phase::kCommunication);
      if (absl::Status s = island.Migrate(pg, fitness); !s.ok()) return s;
    }
    if (!last) {
      if (hooks.phases) hooks.phases->Enter(Phase::kOptimizer);
      island.Evolve(fitness);
    }
    const double loss = 1.0 - fitness.max().item<double>();
    if (hooks.on_step) {
      hooks.on_step(batch, SecondsSince(step_start), loss);
    }
    progress.AddStep(loss);
    progress.MaybeReport(g + 1, SecondsSince(start));
  }
  result.set_steps(g);
  result.set_samples((g - *first) * batch);
  result.set_train_seconds(SecondsSince(start));
  if (result.cancelled()) return absl::CancelledError("cancelled");
  // The job's model: each island's best on a larger slice of its own shard competes (the
  // test split only measures the winner).
  if (hooks.phases) hooks.phases->Enter(Phase::kEvaluation);
  const torch::Tensor slice = shard.narrow(0, 0, std::min<int64_t>(shard.numel(), 4096));
  const torch::Tensor final_fitness = island.Fitness(x.index({slice}), train_y.index({slice}));
  const int64_t best_here =
      torch::argsort(final_fitness, /*stable=*/true, 0, /*descending=*/true)[0].item<int64_t>();
  std::vector<float> mine = {final_fitness[best_here].item<float>()},
                     all(static_cast<size_t>(pg.size()));
  if (absl::Status s = pg.Allgather(std::span<const float>(mine), std::span<float>(all)); !s.ok()) {
    return s;
  }
  int winner = 0;
  for (int r = 1; r < pg.size(); ++r) {
    if (all[r] > all[winner]) winner = r;
  }
  auto [w, b] = island.Individual(best_here);
  torch::Tensor flat = torch::cat({w.reshape({-1}), b}).contiguous();
  if (absl::Status s = pg.Broadcast(std::span<float>(flat.data_ptr<float>(), flat.numel()), winner);
      !s.ok()) {
    return s;
  }
  w = flat.narrow(0, 0, classes * features).reshape({classes, features});
  b = flat.narrow(0, classes * features, classes);
  const torch::Tensor tx = test_x.reshape({test_x.size(0), features});
  double accuracy = 0, test_loss = 0;
  if (tx.size(0) > 0) {
    const torch::Tensor logits = torch::addmm(b, tx, w.t());
    accuracy = logits.argmax(1).eq(test_y).to(torch::kFloat32).mean().item<double>();
    test_loss = torch::nn::functional::cross_entropy(logits, test_y).item<double>();
  }
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(flat.data_ptr<float>()),
                          static_cast<uInt>(flat.numel() * sizeof(float)));
  result.set_ok(true);
  result.set_test_accuracy(accuracy);
  result.set_test_loss(test_loss);
  result.set_parameter_hash(absl::StrFormat("%08x", static_cast<uint32_t>(crc)));
  v1::EpochRecord* h = result.add_history();
  h->set_epoch(1);
  h->set_step(ga.generations());
  h->set_samples(ga.generations() * batch);
  h->set_elapsed_seconds(SecondsSince(start));
  h->set_train_loss(-1);
  h->set_test_accuracy(accuracy);
  h->set_test_loss(test_loss);
  h->set_joules(hooks.energy_joules ? hooks.energy_joules() : 0);
  h->set_attempt(a.attempt());
  progress.SetEvaluation(accuracy, test_loss);
  progress.Report(ga.generations(), SecondsSince(start));
  if (hooks.phases) hooks.phases->Enter(Phase::kIdle);
  return absl::OkStatus();
}

}  // namespace joule::worker
