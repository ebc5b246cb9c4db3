#ifndef JOULE_WORKER_TRAIN_GA_H_
#define JOULE_WORKER_TRAIN_GA_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "joule/v1/job.pb.h"
#include "worker/comm/process_group.h"
#include "worker/models/models.h"
#include "worker/train/attempt_context.h"
#include "worker/train/splits.h"

namespace joule::worker {

// One island of the genetic algorithm (JobSpec.algorithm "ga"): a population of networks
// of `layers` widths [features, hidden..., classes] ({features, classes}: logistic
// regression; with hidden widths, the mlp's Linear-ReLU stack). Each layer's population is
// kept in one GEMM layout: weights [in, P*out] (individual p's [in, out] block at columns
// p*out..) and bias [P*out], so that the first layer of the whole population is one GEMM
// ([B, features] x [features, P*out]) and every later one one batched product. Fitness =
// accuracy on the batch. Each generation: the `elite` best are kept; every other child
// comes from two tournament-selected parents (size 2), mixed weight by weight with
// probability `crossover_rate`, each weight then moved by a N(0, mutation_scale) draw
// with probability `mutation_rate`. Randomness from one generator seeded with (seed,
// rank), reseeded with (seed, rank, generation) by the run at every generation: the same
// seed gives the same run, and a run resumed from a checkpoint at generation g goes on
// exactly as the uninterrupted one. Not thread-safe.
class GaIsland {
 public:
  // `layers`: at least 2 widths, each >= 1; spec.population() individuals (>= 2).
  GaIsland(std::vector<int64_t> layers, const v1::GaSpec& spec, uint64_t seed, int rank);
  // Logistic regression: layers {features, classes}.
  GaIsland(int64_t features, int64_t classes, const v1::GaSpec& spec, uint64_t seed, int rank)
      : GaIsland(std::vector<int64_t>{features, classes}, spec, seed, rank) {}

  // Accuracy of each individual on (x [B, features], y [B]): [P], on the intra-op threads.
  torch::Tensor Fitness(const torch::Tensor& x, const torch::Tensor& y) const;
  // The same values, one individual at a time (its own products, as a GA written one
  // individual at a time): the serial baseline the batched form is measured against
  // (bench/ga_bench.cc) and checked against (tests/worker/ga_test.cc).
  torch::Tensor FitnessOneByOne(const torch::Tensor& x, const torch::Tensor& y) const;
  // The next generation from the current one's fitness ([P]).
  void Evolve(const torch::Tensor& fitness);
  // Ring migration: each island sends its `migration_size` best (by `fitness`) with their
  // fitness to the next rank, which puts them in place of its worst and updates `fitness`
  // for them (so they compete at once). Every rank must call it.
  absl::Status Migrate(ProcessGroup& pg, torch::Tensor& fitness);

  // Individual `p` as one flat genome of genome_size() floats: layer after layer, its
  // weight [out, in] (nn.Linear's layout, row-major) then its bias [out].
  torch::Tensor Genome(int64_t p) const;
  // Replaces individual `p` (Genome's layout; genome_size() floats).
  void SetGenome(int64_t p, const torch::Tensor& genome);
  int64_t genome_size() const;
  // The logits [B, classes] of one genome (Genome's layout) on x [B, features].
  torch::Tensor Logits(const torch::Tensor& genome, const torch::Tensor& x) const;

  int64_t population() const { return population_; }
  const std::vector<int64_t>& layers() const { return layers_; }
  torch::Generator& generator() { return generator_; }
  // Restarts the generator from (seed, rank, generation).
  void Reseed(uint64_t seed, int rank, int64_t generation);
  // The whole population: per layer its weights [in, P*out] then its bias [P*out].
  const std::vector<torch::Tensor>& tensors() const { return tensors_; }
  // Replaces the whole population (copies). INVALID_ARGUMENT when the count or a shape
  // differs.
  absl::Status SetTensors(const std::vector<torch::Tensor>& tensors);

 private:
  std::vector<int64_t> layers_;
  int64_t population_;
  v1::GaSpec spec_;
  torch::Generator generator_;
  std::vector<torch::Tensor> tensors_;  // w0 [in0, P*out0], b0 [P*out0], w1, b1, ...
};

// Runs a GA attempt on the prepared data and group (each rank an island of
// spec.ga.population / world size individuals of the spec's model: logreg, or the mlp of
// spec.hidden_sizes; `classes`: the job model's, from
// Prepare): `spec.ga.generations` generations (from the newest checkpoint in
// `checkpoint_dir` that matches the spec, if any: then result.resumed_from_step is its
// generation), each on a fitness batch drawn from this
// rank's strided shard of the training split, migrations every `migration_interval`
// generations; then each island's best on a larger slice of its shard (up to 4096
// examples; never the test split) competes, and every rank takes the winner (broadcast
// from its rank) as the job's model: result gets ok, steps (generations), samples
// (training examples drawn: generations x batch), the test accuracy and loss of that
// model, the parameter hash and one history record. Progress about every second
// (hooks.on_progress: step = generation, loss = 1 - the best fitness). Phases: fitness ->
// forward, selection and variation -> optimizer, migration -> communication, the test
// evaluation -> evaluation, checkpoints -> checkpoint.
//
// Checkpoints (rank 0's `checkpoint_dir` not empty - it decides for every rank - and
// spec.checkpoint_every_steps > 0): before
// every checkpoint_every_steps-th generation every island's population is gathered to
// rank 0, which writes them (tensors "island.R.layer.L.weights" and "...bias", global_step =
// the generation to run next). A resumed attempt's rank 0 reads them and broadcasts them;
// rank r takes island r (the spec hash covers the world size). A checkpoint that cannot be
// written is logged and the run goes on. A job with an energy budget agrees every
// kStopCheckInterval generations whether any rank was asked to stop (hooks.stop_requested);
// then rank 0 writes the islands and every rank returns CANCELLED ("stopped at generation
// G ...", result.cancelled) with its partial figures. With spec.keep_model, rank 0 writes the
// winner's genome as `model`'s parameters (a genome is the Linear stack's parameters in
// order) in the job model's final checkpoint, for `joule export`. INVALID_ARGUMENT, before
// any collective, when an island's weights would be over 2^28 floats (1 GiB).
absl::Status RunGeneticAlgorithm(const AttemptContext& ctx, Splits& splits, Model& model);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_GA_H_
