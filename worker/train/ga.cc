#include "worker/train/ga.h"

#include <ATen/CPUGeneratorImpl.h>
#include <zlib.h>

#include <chrono>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "spdlog/spdlog.h"
#include "worker/energy/phase_clock.h"
#include "worker/train/checkpoint.h"
#include "worker/train/checkpoint_assembly.h"
#include "worker/train/model_state.h"
#include "worker/train/optimizer.h"
#include "worker/train/progress_reporter.h"
#include "worker/train/resume_point.h"

namespace joule::worker {
namespace {

constexpr int64_t kMaxIslandFloats = kMaxGaIslandFloats;  // common/job_spec.h

// Seconds from `t` to now, by the attempt's clock.
double SecondsSince(const AttemptContext& ctx, joule::Clock::TimePoint t) {
  return joule::Seconds(ctx.clock.Now() - t);
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
  const torch::Tensor bits =
      torch::bitwise_and(torch::bitwise_right_shift(words, torch::arange(30, torch::kLong)), 1);
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
    // Geometric(p) by inversion, floor(log(u) / log(1 - p)) + 1 with u in (0, 1] (LibTorch's
    // geometric_ gives -inf for p below ~1e-16). Gaps past the end are all the same to the
    // result: clamped, they neither overflow int64 nor convert undefined, whatever p.
    const torch::Tensor u = 1.0 - torch::rand({m}, generator, torch::kDouble);
    torch::Tensor gaps =
        (u.log() / std::log1p(-p)).floor_().add_(1).clamp_max_(static_cast<double>(n - next + 1));
    torch::Tensor at = gaps.to(torch::kLong).cumsum(0) + (next - 1);
    const int64_t last = at[m - 1].item<int64_t>();
    parts.push_back(at.masked_select(at < n));
    next = last + 1;
  }
  return torch::cat(parts);
}

// An island's population as one flat float buffer: its tensors() in order.
torch::Tensor FlatPopulation(const GaIsland& island) {
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& t : island.tensors()) parts.push_back(t.reshape({-1}));
  return torch::cat(parts).contiguous();
}

std::string TensorName(int island, size_t i) {
  return absl::StrCat("island.", island, ".layer.", i / 2, i % 2 == 0 ? ".weights" : ".bias");
}

// Before generation `generation`: every island to rank 0, which writes them. Collective.
// A write that fails is logged (the run goes on); a failed gather is the run's error.
absl::Status SaveGaCheckpoint(const v1::Assignment& a, ProcessGroup& pg, const GaIsland& island,
                              const std::string& dir, int64_t generation, PhaseClock* phases) {
  ScopedPhase phase(phases, Phase::kCheckpoint);
  const torch::Tensor mine = FlatPopulation(island);
  const int64_t n = mine.numel();
  std::vector<float> all(static_cast<size_t>(n * pg.size()));
  if (absl::Status s =
          pg.Allgather(std::span<const float>(mine.data_ptr<float>(), n), std::span<float>(all));
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
  for (int r = 0; r < pg.size(); ++r) {
    const float* at = all.data() + static_cast<size_t>(r) * n;
    for (size_t i = 0; i < island.tensors().size(); ++i) {
      const torch::Tensor& t = island.tensors()[i];
      v1::TensorData* d = c.add_parameters();
      d->set_name(TensorName(r, i));
      for (int64_t size : t.sizes()) d->add_shape(size);
      d->mutable_values()->Add(at, at + t.numel());
      at += t.numel();
    }
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
std::optional<std::vector<float>> LoadGaCheckpoint(const v1::Assignment& a, const GaIsland& island,
                                                   const std::string& dir, int64_t* generation) {
  if (dir.empty()) return std::nullopt;
  std::vector<std::string> skipped;
  // The islands, not a model kept from an earlier attempt (keep_model: a newer file).
  absl::StatusOr<v1::Checkpoint> c =
      LoadNewestCheckpoint(dir, SpecHash(a.spec()), &skipped, [](const v1::Checkpoint& c) {
        return c.parameters_size() > 0 && absl::StartsWith(c.parameters(0).name(), "island.")
                   ? std::string()
                   : std::string("a model, not a genetic algorithm's islands");
      });
  for (const std::string& why : skipped) spdlog::warn("job {}: skipping {}", a.job_id(), why);
  if (!c.ok()) return std::nullopt;
  const std::vector<torch::Tensor>& shapes = island.tensors();
  const size_t per_island = shapes.size();
  std::vector<float> flat;
  bool fits = c->parameters_size() == static_cast<int>(per_island) * a.world_size() &&
              c->global_step() >= 0 && c->global_step() <= a.spec().ga().generations();
  for (int i = 0; fits && i < c->parameters_size(); ++i) {
    const v1::TensorData& t = c->parameters(i);
    const size_t k = static_cast<size_t>(i) % per_island;
    fits = t.name() == TensorName(i / static_cast<int>(per_island), k) &&
           t.values_size() == shapes[k].numel();
    if (fits) flat.insert(flat.end(), t.values().begin(), t.values().end());
  }
  if (!fits) {
    spdlog::warn(
        "job {}: the newest checkpoint (generation {}) does not hold this run's "
        "islands; starting from generation 0",
        a.job_id(), c->global_step());
    return std::nullopt;
  }
  *generation = c->global_step();
  return flat;
}

// Every rank's island from rank 0's checkpoint, if it has one: returns the generation to
// run next (0: none). Collective.
absl::StatusOr<int64_t> ResumeIslands(const v1::Assignment& a, ProcessGroup& pg, GaIsland& island,
                                      const std::string& dir) {
  std::optional<std::vector<float>> flat;
  std::optional<ResumePoint> point;
  if (pg.rank() == 0) {
    int64_t generation = 0;
    flat = LoadGaCheckpoint(a, island, dir, &generation);
    if (flat) {
      point.emplace();
      point->global_step = generation;
    }
  }
  if (absl::Status s = BroadcastResumePoint(pg, 0, &point); !s.ok()) return s;
  if (!point) return 0;
  int64_t n = 0;
  for (const torch::Tensor& t : island.tensors()) n += t.numel();
  if (!flat) flat.emplace(static_cast<size_t>(n * pg.size()));
  if (absl::Status s = pg.Broadcast(std::span<float>(*flat), 0); !s.ok()) return s;
  const torch::Tensor mine =
      torch::from_blob(flat->data() + static_cast<size_t>(pg.rank()) * n, {n}, torch::kFloat32);
  std::vector<torch::Tensor> tensors;
  int64_t at = 0;
  for (const torch::Tensor& t : island.tensors()) {
    tensors.push_back(mine.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
  if (absl::Status s = island.SetTensors(tensors); !s.ok()) return s;
  return point->global_step;
}

}  // namespace

GaIsland::GaIsland(std::vector<int64_t> layers, const v1::GaSpec& spec, uint64_t seed, int rank)
    : layers_(std::move(layers)),
      population_(spec.population()),
      spec_(spec),
      generator_(at::make_generator<at::CPUGeneratorImpl>(StreamSeed(seed, rank, -1))) {
  for (size_t l = 0; l + 1 < layers_.size(); ++l) {
    // Small random weights, as nn.Linear's scale 1/sqrt(in); zero biases.
    const double scale = 1.0 / std::sqrt(static_cast<double>(layers_[l]));
    tensors_.push_back(torch::randn({layers_[l], population_ * layers_[l + 1]}, generator_) *
                       scale);
    tensors_.push_back(torch::zeros({population_ * layers_[l + 1]}));
  }
}

void GaIsland::Reseed(uint64_t seed, int rank, int64_t generation) {
  generator_.set_current_seed(StreamSeed(seed, rank, generation));
}

absl::Status GaIsland::SetTensors(const std::vector<torch::Tensor>& tensors) {
  if (tensors.size() != tensors_.size()) {
    return absl::InvalidArgumentError("the population has another number of layers");
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].sizes() != tensors_[i].sizes()) {
      return absl::InvalidArgumentError("the population's shapes differ from this island's");
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensors_[i] = tensors[i].to(torch::kFloat32).clone().contiguous();
  }
  return absl::OkStatus();
}

int64_t GaIsland::genome_size() const {
  int64_t n = 0;
  for (size_t l = 0; l + 1 < layers_.size(); ++l) n += (layers_[l] + 1) * layers_[l + 1];
  return n;
}

torch::Tensor GaIsland::Genome(int64_t p) const {
  std::vector<torch::Tensor> parts;
  for (size_t l = 0; l + 1 < layers_.size(); ++l) {
    const int64_t out = layers_[l + 1];
    parts.push_back(tensors_[2 * l].narrow(1, p * out, out).t().reshape({-1}));
    parts.push_back(tensors_[2 * l + 1].narrow(0, p * out, out));
  }
  return torch::cat(parts);
}

void GaIsland::SetGenome(int64_t p, const torch::Tensor& genome) {
  int64_t at = 0;
  for (size_t l = 0; l + 1 < layers_.size(); ++l) {
    const int64_t in = layers_[l], out = layers_[l + 1];
    tensors_[2 * l]
        .narrow(1, p * out, out)
        .copy_(genome.narrow(0, at, in * out).view({out, in}).t());
    at += in * out;
    tensors_[2 * l + 1].narrow(0, p * out, out).copy_(genome.narrow(0, at, out));
    at += out;
  }
}

torch::Tensor GaIsland::Logits(const torch::Tensor& genome, const torch::Tensor& x) const {
  torch::Tensor h = x.reshape({x.size(0), layers_[0]});
  int64_t at = 0;
  for (size_t l = 0; l + 1 < layers_.size(); ++l) {
    const int64_t in = layers_[l], out = layers_[l + 1];
    if (l > 0) h = torch::relu(h);
    const torch::Tensor w = genome.narrow(0, at, in * out).view({out, in});
    at += in * out;
    h = torch::addmm(genome.narrow(0, at, out), h, w.t());
    at += out;
  }
  return h;
}

torch::Tensor GaIsland::FitnessOneByOne(const torch::Tensor& x, const torch::Tensor& y) const {
  torch::Tensor fitness = torch::empty({population_});
  for (int64_t p = 0; p < population_; ++p) {
    fitness[p] = Logits(Genome(p), x).argmax(1).eq(y).to(torch::kFloat32).mean();
  }
  return fitness;
}

torch::Tensor GaIsland::Fitness(const torch::Tensor& x, const torch::Tensor& y) const {
  const int64_t b = x.size(0), p = population_;
  // The first layer of every individual: one GEMM, [B, P*out0] seen as [B, P, out0].
  torch::Tensor h =
      torch::addmm(tensors_[1], x.reshape({b, layers_[0]}), tensors_[0]).view({b, p, layers_[1]});
  for (size_t l = 1; l + 1 < layers_.size(); ++l) {
    const int64_t in = layers_[l], out = layers_[l + 1];
    // [P, B, in] x [P, in, out] + bias [P, 1, out]: one batched product.
    h = torch::baddbmm(tensors_[2 * l + 1].view({p, 1, out}), torch::relu(h).transpose(0, 1),
                       tensors_[2 * l].view({in, p, out}).transpose(0, 1))
            .transpose(0, 1);  // [B, P, out]
  }
  torch::Tensor predicted = h.argmax(2);                               // [B, P]
  return predicted.eq(y.reshape({b, 1})).to(torch::kFloat32).mean(0);  // [P]
}

void GaIsland::Evolve(const torch::Tensor& fitness) {
  const int64_t p = population_;
  torch::Tensor order = torch::argsort(fitness, /*stable=*/true, 0, /*descending=*/true);
  const int64_t elite = spec_.elite();
  const int64_t children = p - elite;
  // Tournaments of two for both parents of every child.
  torch::Tensor a = torch::randint(p, {children, 2}, generator_, torch::kLong);
  torch::Tensor b = torch::randint(p, {children, 2}, generator_, torch::kLong);
  torch::Tensor first =
      torch::where(fitness.index({a.select(1, 0)}) >= fitness.index({a.select(1, 1)}),
                   a.select(1, 0), a.select(1, 1));
  torch::Tensor second =
      torch::where(fitness.index({b.select(1, 0)}) >= fitness.index({b.select(1, 1)}),
                   b.select(1, 0), b.select(1, 1));
  const torch::Tensor mixes = torch::rand({children}, generator_) < spec_.crossover_rate();
  const torch::Tensor keep = order.narrow(0, 0, elite);
  // Each tensor evolves in its GEMM layout, an individual a block along dimension 1 of
  // [in, P, out] (weights) or 0 of [P, out] (bias): no transposed copy of the population.
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const int64_t out = layers_[i / 2 + 1];
    const bool weights = i % 2 == 0;
    const int64_t dim = weights ? 1 : 0;
    const torch::Tensor genes =
        weights ? tensors_[i].view({layers_[i / 2], p, out}) : tensors_[i].view({p, out});
    // Uniform crossover for the children chosen to mix, weight by weight.
    torch::Tensor mother = genes.index_select(dim, first), father = genes.index_select(dim, second);
    std::vector<int64_t> per_child(static_cast<size_t>(mother.dim()), 1);
    per_child[static_cast<size_t>(dim)] = children;
    const torch::Tensor take =
        mixes.view(per_child).logical_and(RandomBits(mother.sizes(), generator_));
    torch::Tensor child = torch::where(take, father, mother);
    // Gaussian mutation, where a Bernoulli(mutation_rate) trial per weight succeeds.
    const torch::Tensor at = BernoulliPositions(child.numel(), spec_.mutation_rate(), generator_);
    if (at.numel() > 0) {
      child.view({-1}).index_add_(0, at,
                                  torch::randn({at.numel()}, generator_) * spec_.mutation_scale());
    }
    tensors_[i] =
        torch::cat({genes.index_select(dim, keep), child}, dim).reshape(tensors_[i].sizes());
  }
}

absl::Status GaIsland::Migrate(ProcessGroup& pg, torch::Tensor& fitness) {
  const int64_t k = spec_.migration_size();
  const int world = pg.size();
  if (k <= 0 || world < 2) return absl::OkStatus();
  torch::Tensor order = torch::argsort(fitness, /*stable=*/true, 0, /*descending=*/true);
  // Each migrant: its genome, then its fitness.
  const int64_t genome = genome_size(), row = genome + 1;
  torch::Tensor mine = torch::empty({k, row});
  for (int64_t i = 0; i < k; ++i) {
    const int64_t p = order[i].item<int64_t>();
    mine[i] = torch::cat({Genome(p), fitness[p].reshape({1})});
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
      torch::from_blob(all.data() + static_cast<size_t>(from * k * row), {k, row}, torch::kFloat32)
          .clone();
  for (int64_t i = 0; i < k; ++i) {
    const int64_t worst = order[population_ - 1 - i].item<int64_t>();
    SetGenome(worst, incoming[i].narrow(0, 0, genome));
    fitness[worst] = incoming[i][genome];
  }
  return absl::OkStatus();
}

namespace {

// A budgeted job before generation `g`: the ranks agree whether any was asked to stop
// (the coordinator's budget); if so, the islands are checkpointed (`checkpoint`: rank 0's
// decision, the same on every rank, as the gather is collective; rank 0 writes into `dir`)
// and the attempt ends CANCELLED with its partial figures (`samples` drawn), as an sgd
// job's graceful stop. OK: go on. Collective.
absl::Status StopIfAgreed(const AttemptContext& ctx, const GaIsland& island, bool checkpoint,
                          int64_t g, int64_t samples, joule::Clock::TimePoint start) {
  absl::StatusOr<bool> stop = AgreeToStop(ctx);
  if (!stop.ok()) return stop.status();
  if (!*stop) return absl::OkStatus();
  if (checkpoint) {
    if (absl::Status s = SaveGaCheckpoint(ctx.assignment, ctx.pg, island, ctx.checkpoint_dir, g,
                                          ctx.hooks.phases);
        !s.ok()) {
      return s;
    }
  }
  v1::RankResult& result = ctx.result;
  result.set_steps(g);
  result.set_samples(samples);
  result.set_train_seconds(SecondsSince(ctx, start));
  result.set_cancelled(true);
  return absl::CancelledError(absl::StrCat(
      "stopped at generation ", g, " as the coordinator asked",
      checkpoint ? ", after a checkpoint" : " (no checkpoint: rank 0 has no directory)"));
}

// The island's layer widths for the spec's model; INVALID_ARGUMENT when an island's
// weights (with Evolve's few copies of them) would not fit a worker: over kMaxIslandFloats
// (1 GiB of float32). The same on every rank (the same data shape).
absl::StatusOr<std::vector<int64_t>> IslandLayers(const v1::JobSpec& spec, int64_t features,
                                                  int64_t classes, int64_t population) {
  std::vector<int64_t> layers = {features};
  if (spec.model() == "mlp") {
    layers.insert(layers.end(), spec.hidden_sizes().begin(), spec.hidden_sizes().end());
  }
  layers.push_back(classes);
  int64_t genome = 0;
  for (size_t l = 0; l + 1 < layers.size(); ++l) genome += (layers[l] + 1) * layers[l + 1];
  if (genome > kMaxIslandFloats / population) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "an island of %d genomes of %d weights is over %d floats (1 GiB): use a smaller "
        "ga.population, more workers or smaller hidden_sizes",
        population, genome, kMaxIslandFloats));
  }
  return layers;
}

// The job's model: each island's best on a slice of its own shard (up to 4096 examples,
// scored a batch at a time so the activations stay a generation's) competes, and every
// rank gets the winner's genome. Collective.
absl::StatusOr<torch::Tensor> BestGenomeOfAllIslands(ProcessGroup& pg, const GaIsland& island,
                                                     const torch::Tensor& x, const torch::Tensor& y,
                                                     const torch::Tensor& shard, int64_t batch) {
  const int64_t slice_size = std::min<int64_t>(shard.numel(), 4096);
  torch::Tensor fitness = torch::zeros({island.population()});
  for (int64_t at = 0; at < slice_size; at += batch) {
    const int64_t n = std::min(batch, slice_size - at);
    const torch::Tensor rows = shard.narrow(0, at, n);
    fitness += island.Fitness(x.index({rows}), y.index({rows})) *
               (static_cast<double>(n) / static_cast<double>(slice_size));
  }
  const int64_t best_here =
      torch::argsort(fitness, /*stable=*/true, 0, /*descending=*/true)[0].item<int64_t>();
  std::vector<float> mine = {fitness[best_here].item<float>()}, all(static_cast<size_t>(pg.size()));
  if (absl::Status s = pg.Allgather(std::span<const float>(mine), std::span<float>(all)); !s.ok()) {
    return s;
  }
  int winner = 0;
  for (int r = 1; r < pg.size(); ++r) {
    if (all[r] > all[winner]) winner = r;
  }
  torch::Tensor genome = island.Genome(best_here).contiguous();
  if (absl::Status s =
          pg.Broadcast(std::span<float>(genome.data_ptr<float>(), genome.numel()), winner);
      !s.ok()) {
    return s;
  }
  return genome;
}

// The finished run's figures: the model's test accuracy and loss, its hash, one history
// record, and the last progress report.
void RecordGaResult(const AttemptContext& ctx, const GaIsland& island,
                    const torch::Tensor& genome, const torch::Tensor& test_x,
                    const torch::Tensor& test_y, int64_t batch, joule::Clock::TimePoint start,
                    ProgressReporter& progress) {
  v1::RankResult& result = ctx.result;
  const int32_t generations = ctx.spec().ga().generations();
  const torch::Tensor tx = test_x.reshape({test_x.size(0), island.layers()[0]});
  double accuracy = 0, test_loss = 0;
  if (tx.size(0) > 0) {
    const torch::Tensor logits = island.Logits(genome, tx);
    accuracy = logits.argmax(1).eq(test_y).to(torch::kFloat32).mean().item<double>();
    test_loss = torch::nn::functional::cross_entropy(logits, test_y).item<double>();
  }
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(genome.data_ptr<float>()),
                          static_cast<uInt>(genome.numel() * sizeof(float)));
  result.set_ok(true);
  result.set_test_accuracy(accuracy);
  result.set_test_loss(test_loss);
  result.set_parameter_hash(HashText(static_cast<uint32_t>(crc)));
  SplitEvaluation test;
  test.accuracy = accuracy;
  test.loss = test_loss;
  RecordEpoch(ctx, 1, generations, generations * batch, -1, /*lr=*/0, test);
  progress.SetEvaluation(accuracy, test_loss);
  progress.Report(generations, SecondsSince(ctx, start));
}

// The run itself (RunGeneticAlgorithm's contract); `winner`: the job model's genome on
// success.
absl::Status Evolve(const AttemptContext& ctx, Splits& splits, torch::Tensor* winner) {
  const v1::Assignment& a = ctx.assignment;
  const TrainHooks& hooks = ctx.hooks;
  ProcessGroup& pg = ctx.pg;
  const std::string& checkpoint_dir = ctx.checkpoint_dir;
  v1::RankResult& result = ctx.result;
  const v1::JobSpec& spec = a.spec();
  const v1::GaSpec& ga = spec.ga();
  const int64_t classes = std::max(splits.train.classes, splits.test.classes);
  const torch::Tensor train_x = ImagesTensor(splits.train), train_y = LabelsTensor(splits.train);
  const torch::Tensor test_x = ImagesTensor(splits.test), test_y = LabelsTensor(splits.test);
  const joule::Clock::TimePoint start = ctx.clock.Now();
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
  absl::StatusOr<std::vector<int64_t>> layers =
      IslandLayers(spec, features, classes, island_spec.population());
  if (!layers.ok()) return layers.status();
  GaIsland island(*std::move(layers), island_spec, spec.seed(), a.rank());
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
                            ctx.clock, ctx.wall_start);
  progress.SetEpoch(1);
  // Whether to checkpoint is rank 0's to say (it writes; each worker has its own
  // --checkpoint-root, possibly none): every rank must take part in the gathers alike.
  float writes = pg.rank() == 0 && !checkpoint_dir.empty() ? 1.0f : 0.0f;
  const bool budgeted = spec.energy_budget_joules() > 0;
  if (spec.checkpoint_every_steps() > 0 || budgeted) {
    if (absl::Status s = pg.Broadcast(std::span<float>(&writes, 1), 0); !s.ok()) return s;
  }
  const int64_t every = writes > 0 ? spec.checkpoint_every_steps() : 0;
  int64_t g = *first;
  for (; g < ga.generations(); ++g) {
    if (hooks.cancelled && hooks.cancelled()) {
      result.set_cancelled(true);
      break;
    }
    if (budgeted && g > *first && g % kStopCheckInterval == 0) {
      if (absl::Status s = StopIfAgreed(ctx, island, writes > 0, g, (g - *first) * batch, start);
          !s.ok()) {
        return s;
      }
    }
    if (every > 0 && g > *first && g % every == 0) {
      if (absl::Status s = SaveGaCheckpoint(a, pg, island, checkpoint_dir, g, hooks.phases);
          !s.ok()) {
        return s;
      }
    }
    island.Reseed(spec.seed(), a.rank(), g);
    const joule::Clock::TimePoint step_start = ctx.clock.Now();
    if (hooks.phases) hooks.phases->Enter(Phase::kForward);
    torch::Tensor pick =
        shard.index({torch::randint(shard.numel(), {batch}, island.generator(), torch::kLong)});
    torch::Tensor fitness = island.Fitness(x.index({pick}), train_y.index({pick}));
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
    if (hooks.on_step) hooks.on_step(batch, SecondsSince(ctx, step_start), loss);
    progress.AddStep(loss);
    progress.MaybeReport(g + 1, SecondsSince(ctx, start));
  }
  result.set_steps(g);
  result.set_samples((g - *first) * batch);
  result.set_train_seconds(SecondsSince(ctx, start));
  if (result.cancelled()) return absl::CancelledError("cancelled");
  if (hooks.phases) hooks.phases->Enter(Phase::kEvaluation);
  absl::StatusOr<torch::Tensor> genome =
      BestGenomeOfAllIslands(pg, island, x, train_y, shard, batch);
  if (!genome.ok()) return genome.status();
  RecordGaResult(ctx, island, *genome, test_x, test_y, batch, start, progress);
  if (winner) *winner = *genome;
  if (hooks.phases) hooks.phases->Enter(Phase::kIdle);
  return absl::OkStatus();
}

// keep_model for a ga job (rank 0): the winner's genome becomes the job model's
// parameters (a genome is the Linear stack's parameters in order: each layer's weight
// [out, in], then its bias) and is written as the final checkpoint, as an sgd job's is,
// for `joule export`. A failure is logged, as the final checkpoint of an sgd job.
void KeepGaModel(const AttemptContext& ctx, const torch::Tensor& genome, Model& model) {
  const v1::Assignment& a = ctx.assignment;
  const TrainHooks& hooks = ctx.hooks;
  const v1::RankResult& result = ctx.result;
  const std::string& dir = ctx.checkpoint_dir;
  if (dir.empty()) {
    spdlog::warn("job {}: keep_model: the worker has no checkpoint directory", a.job_id());
    return;
  }
  ScopedPhase phase(hooks.phases, Phase::kCheckpoint);
  ModelTensors tensors = CollectModelTensors(model);
  int64_t n = 0;
  for (const torch::Tensor& t : tensors.parameters) n += t.numel();
  if (n != genome.numel()) {
    spdlog::warn("job {}: keep_model: the genome has {} weights, the model {}", a.job_id(),
                 genome.numel(), n);
    return;
  }
  {
    torch::NoGradGuard no_grad;
    Unpack(genome, tensors.parameters);
  }
  const Optimizer unused(tensors.parameters, OptimizerOptions{});  // no state: none is written
  const CheckpointPosition position{std::max(1, a.spec().epochs()), 0,
                                    a.spec().ga().generations(), result.test_accuracy(),
                                    result.test_loss(), /*plateau=*/std::nullopt};
  if (absl::Status s = WriteCheckpoint(
          dir, AssembleCheckpoint(a, SpecHash(a.spec()), position, tensors, unused, {}),
          a.spec().keep_checkpoints());
      !s.ok()) {
    spdlog::warn("job {}: keep_model: {}", a.job_id(), s.ToString());
  }
}

}  // namespace

absl::Status RunGeneticAlgorithm(const AttemptContext& ctx, Splits& splits, Model& model) {
  torch::Tensor winner;
  absl::Status s = Evolve(ctx, splits, &winner);
  if (s.ok() && ctx.spec().keep_model() && ctx.assignment.rank() == 0) {
    KeepGaModel(ctx, winner, model);
  }
  return s;
}

}  // namespace joule::worker
