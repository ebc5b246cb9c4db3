#include "worker/train/ga.h"

#include <gtest/gtest.h>

#include "tests/testing/run_ranks.h"
#include "worker/comm/shm_process_group.h"

namespace joule::worker {
namespace {

// Two Gaussian blobs in the plane, at (-2, -2) (class 0) and (2, 2) (class 1): a linear
// separator scores ~1.
std::pair<torch::Tensor, torch::Tensor> Blobs(int n, uint64_t seed) {
  torch::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor y = torch::randint(2, {n}, g, torch::kLong);
  torch::Tensor centre = (y.to(torch::kFloat32) * 4 - 2).unsqueeze(1).expand({n, 2});
  return {centre + torch::randn({n, 2}, g), y};
}

v1::GaSpec Spec() {
  v1::GaSpec s;
  s.set_population(32);
  s.set_generations(40);
  s.set_mutation_rate(0.2);
  s.set_mutation_scale(0.3);
  s.set_crossover_rate(0.5);
  s.set_elite(2);
  s.set_migration_size(1);
  s.set_fitness_batch(400);
  return s;
}

// Four classes, the quadrants of the plane: linearly separable (w_k = the quadrant's
// direction), and hard for a random linear classifier.
std::pair<torch::Tensor, torch::Tensor> Quadrants(int n, uint64_t seed) {
  torch::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor x = torch::randn({n, 2}, g);
  torch::Tensor y =
      (x.select(1, 0) > 0).to(torch::kLong) * 2 + (x.select(1, 1) > 0).to(torch::kLong);
  return {x, y};
}

TEST(GaIslandTest, ConvergesOnASeparableProblemAndNeverLosesItsElite) {
  auto [x, y] = Quadrants(400, 1);
  v1::GaSpec spec = Spec();
  spec.set_generations(80);
  GaIsland island(2, 4, spec, /*seed=*/7, /*rank=*/0);
  const float first = island.Fitness(x, y).max().item<float>();
  ASSERT_LT(first, 0.9f) << "the problem is too easy to show anything";
  float best = first;
  for (int g = 0; g < 80; ++g) {
    torch::Tensor f = island.Fitness(x, y);
    EXPECT_GE(f.max().item<float>(), best - 1e-6)
        << "generation " << g << ": elitism lost the best";
    best = f.max().item<float>();
    island.Evolve(f);
  }
  EXPECT_GT(best, 0.9f) << "started at " << first;
}

TEST(GaIslandTest, TheSameSeedGivesTheSameRunAndAnotherSeedAnother) {
  auto [x, y] = Blobs(200, 2);
  auto run = [&](uint64_t seed) {
    GaIsland island(2, 2, Spec(), seed, 0);
    for (int g = 0; g < 10; ++g) island.Evolve(island.Fitness(x, y));
    return island.Genome(0);
  };
  EXPECT_TRUE(torch::equal(run(5), run(5)));
  EXPECT_FALSE(torch::equal(run(5), run(6)));
}

TEST(GaIslandTest, TheBatchedFitnessIsTheOneByOneFitness) {
  // Evolved individuals (not just the initial draw), an odd batch, 10 classes: one GEMM
  // for the population scores exactly as a product per individual.
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const torch::Tensor x = torch::randn({37, 20}, gen);
  const torch::Tensor y = torch::randint(10, {37}, gen, torch::kLong);
  for (const std::vector<int64_t>& layers :
       {std::vector<int64_t>{20, 10}, std::vector<int64_t>{20, 16, 10},
        std::vector<int64_t>{20, 16, 8, 10}}) {
    GaIsland island(layers, Spec(), 3, 0);
    for (int g = 0; g < 3; ++g) island.Evolve(island.Fitness(x, y));
    const torch::Tensor batched = island.Fitness(x, y), serial = island.FitnessOneByOne(x, y);
    ASSERT_EQ(batched.sizes(), serial.sizes());
    // Equal up to rounding: the two forms sum in different orders, which may flip the
    // argmax of a near tie, one example (1/37) at most here.
    EXPECT_LE((batched - serial).abs().max().item<float>(), 1.0f / 37 + 1e-6f)
        << layers.size() << " layers\n" << batched << serial;
    EXPECT_GT(batched.max().item<float>(), batched.min().item<float>())
        << "all equal: shows nothing";
  }
}

TEST(GaIslandTest, ReseedingAtAGenerationReplaysIt) {
  // What resuming relies on: a population restored at generation g and the generator
  // reseeded for g evolve exactly as the uninterrupted island did (an mlp genome: every
  // layer's tensors).
  auto [x, y] = Blobs(200, 4);
  const std::vector<int64_t> layers = {2, 6, 2};
  GaIsland island(layers, Spec(), 5, 1);
  island.Reseed(5, 1, 0);
  island.Evolve(island.Fitness(x, y));
  GaIsland copy(layers, Spec(), 99, 0);  // other seed, other rank: replaced below
  ASSERT_TRUE(copy.SetTensors(island.tensors()).ok());
  for (GaIsland* i : {&island, &copy}) {
    i->Reseed(5, 1, 1);
    i->Evolve(i->Fitness(x, y));
  }
  ASSERT_EQ(island.tensors().size(), 4u);
  for (size_t t = 0; t < 4; ++t) EXPECT_TRUE(torch::equal(island.tensors()[t], copy.tensors()[t]));
  GaIsland other(layers, Spec(), 5, 1);
  ASSERT_TRUE(other.SetTensors(island.tensors()).ok());
  island.Reseed(5, 1, 2);
  other.Reseed(5, 1, 3);  // another generation: another stream
  island.Evolve(island.Fitness(x, y));
  other.Evolve(other.Fitness(x, y));
  EXPECT_FALSE(torch::equal(island.tensors()[0], other.tensors()[0]));
  std::vector<torch::Tensor> wrong = island.tensors();
  wrong[2] = torch::zeros({7, 64});
  EXPECT_FALSE(copy.SetTensors(wrong).ok());
  wrong.pop_back();
  EXPECT_FALSE(copy.SetTensors(wrong).ok());
}

TEST(GaIslandTest, AGenomeIsTheIndividualsLayersInLinearLayout) {
  // Genome(p) holds each layer's [out, in] weight and bias: Logits of it is the individual's
  // forward pass (Linear, ReLU, Linear), and SetGenome puts it back where it came from.
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const torch::Tensor x = torch::randn({9, 5}, gen);
  GaIsland island(std::vector<int64_t>{5, 4, 3}, Spec(), 1, 0);
  ASSERT_EQ(island.genome_size(), 5 * 4 + 4 + 4 * 3 + 3);
  const torch::Tensor g = island.Genome(7);
  const torch::Tensor w1 = g.narrow(0, 0, 20).view({4, 5}), b1 = g.narrow(0, 20, 4);
  const torch::Tensor w2 = g.narrow(0, 24, 12).view({3, 4}), b2 = g.narrow(0, 36, 3);
  const torch::Tensor by_hand = torch::addmm(b2, torch::relu(torch::addmm(b1, x, w1.t())), w2.t());
  EXPECT_TRUE(torch::allclose(island.Logits(g, x), by_hand));
  const torch::Tensor other = island.Genome(3);
  island.SetGenome(7, other);
  EXPECT_TRUE(torch::equal(island.Genome(7), other));
  island.SetGenome(7, g);
  EXPECT_TRUE(torch::equal(island.Genome(7), g));
}

TEST(GaIslandTest, AnMlpGenomeLearnsWhatALinearOneCannot) {
  // XOR of the signs (classes: same sign / opposite signs) is not linearly separable:
  // logistic regression stays near 0.5 where an mlp with a hidden layer gets well above.
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(6);
  const torch::Tensor x = torch::randn({400, 2}, gen);
  const torch::Tensor y = ((x.select(1, 0) > 0) != (x.select(1, 1) > 0)).to(torch::kLong);
  v1::GaSpec spec = Spec();
  spec.set_population(64);
  auto best_after = [&](std::vector<int64_t> layers) {
    GaIsland island(std::move(layers), spec, 2, 0);
    float best = 0;
    for (int g = 0; g < 150; ++g) {
      island.Reseed(2, 0, g);
      const torch::Tensor f = island.Fitness(x, y);
      best = f.max().item<float>();
      island.Evolve(f);
    }
    return best;
  };
  const float linear = best_after({2, 2}), mlp = best_after({2, 8, 2});
  EXPECT_LT(linear, 0.75f);
  EXPECT_GT(mlp, 0.85f) << "logreg reached " << linear;
}

TEST(GaIslandTest, EveryMutationRateFromZeroToOneEvolves) {
  // Mutation positions come from geometric gaps: rates so small that a gap is past any
  // int64 (or infinite) must neither overflow nor throw; rate 0 mutates nothing (children
  // are exact mixes of their parents' weights), rate 1 everything.
  auto [x, y] = Blobs(100, 8);
  for (double rate : {0.0, 1e-300, 1e-18, 1e-6, 0.5, 1.0}) {
    v1::GaSpec spec = Spec();
    spec.set_mutation_rate(rate);
    GaIsland island(std::vector<int64_t>{2, 3, 2}, spec, 1, 0);
    const torch::Tensor before = island.tensors()[0].clone();
    for (int g = 0; g < 3; ++g) ASSERT_NO_THROW(island.Evolve(island.Fitness(x, y))) << rate;
    // Every weight of generation 3 is one of the first generation's, unless mutated.
    const torch::Tensor after = island.tensors()[0];
    const torch::Tensor found = torch::isin(after, before);
    if (rate <= 1e-18) {
      EXPECT_TRUE(found.all().item<bool>()) << rate;
    } else if (rate == 1.0) {
      EXPECT_FALSE(found.narrow(1, 2 * 3, after.size(1) - 2 * 3).any().item<bool>()) << rate;
    }
  }
  // The rate is the rate: 30 children of 32 x 50 x 20 weights, each mutated with
  // probability 0.05 -> 4.69% new values (binomial sd 0.12 points).
  v1::GaSpec spec = Spec();
  spec.set_mutation_rate(0.05);
  spec.set_elite(2);
  GaIsland island(std::vector<int64_t>{50, 20, 2}, spec, 3, 0);
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const torch::Tensor xs = torch::randn({64, 50}, gen);
  const torch::Tensor ys = torch::randint(2, {64}, gen, torch::kLong);
  const torch::Tensor before = island.tensors()[0].clone();
  island.Evolve(island.Fitness(xs, ys));
  const double fresh =
      1.0 - torch::isin(island.tensors()[0], before).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(fresh, 0.05 * 30 / 32, 0.006);
}

TEST(GaIslandTest, MigrationMovesTheBestIndividualToTheNextRank) {
  auto [x, y] = Blobs(400, 3);
  // Rank 0 holds a perfect separator as individual 3, so its best is at least that good.
  const torch::Tensor perfect_w = torch::tensor({{-1.0f, -1.0f}, {1.0f, 1.0f}});
  const torch::Tensor perfect_b = torch::zeros({2});
  std::vector<torch::Tensor> before(2), after(2);
  torch::Tensor sent;  // rank 0's best, set before it migrates
  testing::RunRanks<ShmProcessGroup>(
      2, [](int r, KvClient& kv) { return ShmProcessGroup::Create(r, 2, kv, ShmOptions{}); },
      [&](int rank, ShmProcessGroup& pg) {
        GaIsland island(2, 2, Spec(), 11, rank);
        if (rank == 0) island.SetGenome(3, torch::cat({perfect_w.reshape({-1}), perfect_b}));
        const torch::Tensor f = island.Fitness(x, y);
        before[rank] = f.clone();
        if (rank == 0) {
          sent = island.Genome(torch::argsort(f, true, 0, true)[0].item<int64_t>());
        }
        torch::Tensor migrated = f.clone();
        ASSERT_TRUE(island.Migrate(pg, migrated).ok());  // an allgather: rank 0 has set `sent`
        // The migrants arrive with their fitness: they compete in the next selection.
        EXPECT_TRUE(torch::allclose(migrated, island.Fitness(x, y))) << "rank " << rank;
        after[rank] = island.Fitness(x, y);
        if (rank == 1) {
          bool found = false;
          for (int64_t p = 0; p < island.population(); ++p) {
            found = found || torch::equal(island.Genome(p), sent);
          }
          EXPECT_TRUE(found) << "rank 0's best did not arrive";
        }
      });
  EXPECT_GE(before[0].max().item<float>(), 0.95f);  // the separator is there
  // Rank 1 keeps its own best (the migrant replaced its worst) and gains rank 0's.
  EXPECT_NEAR(after[1].max().item<float>(),
              std::max(before[0].max().item<float>(), before[1].max().item<float>()), 1e-6);
  EXPECT_GE(after[1].max().item<float>(), before[1].max().item<float>());
}

}  // namespace
}  // namespace joule::worker
