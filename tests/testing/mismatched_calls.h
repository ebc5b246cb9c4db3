#ifndef JOULE_TESTS_TESTING_MISMATCHED_CALLS_H_
#define JOULE_TESTS_TESTING_MISMATCHED_CALLS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/process_group.h"

namespace joule::testing {

// The ways ranks can disagree on a collective: one rank (`odd`) issues a call that differs
// from the others' in length (within one round and across rounds, empty against not),
// reduction, kind, root or wire precision. `run` issues this rank's call; every rank's
// status must then be FAILED_PRECONDITION naming the odd rank and `odd_text`, its call.
struct MismatchedCall {
  std::string name;
  std::function<absl::Status(worker::ProcessGroup&, bool odd)> run;
  std::string odd_text;
};

inline std::vector<MismatchedCall> MismatchedCalls() {
  using worker::ProcessGroup;
  using worker::ReduceOp;
  auto allreduce = [](size_t normal, size_t odd_n) {
    return [=](ProcessGroup& pg, bool odd) {
      std::vector<float> data(odd ? odd_n : normal, 1.0f);
      return pg.Allreduce(data, ReduceOp::kSum);
    };
  };
  return {
      {"lengths", allreduce(100, 200), "allreduce (sum) of 200 floats"},
      {"lengths over several rounds", allreduce(10, 5000), "allreduce (sum) of 5000 floats"},
      {"empty against not", allreduce(8, 0), "allreduce (sum) of 0 floats"},
      {"sum against average",
       [](ProcessGroup& pg, bool odd) {
         std::vector<float> data(16, 1.0f);
         return pg.Allreduce(data, odd ? ReduceOp::kAverage : ReduceOp::kSum);
       },
       "allreduce (average) of 16 floats"},
      {"allreduce against broadcast",
       [](ProcessGroup& pg, bool odd) {
         std::vector<float> data(16, 1.0f);
         return odd ? pg.Broadcast(data, 0) : pg.Allreduce(data, ReduceOp::kSum);
       },
       "broadcast from rank 0 of 16 floats"},
      {"broadcast roots",
       [](ProcessGroup& pg, bool odd) {
         std::vector<float> data(16, 1.0f);
         return pg.Broadcast(data, odd ? 1 : 0);
       },
       "broadcast from rank 1 of 16 floats"},
      {"allgather lengths",
       [](ProcessGroup& pg, bool odd) {
         std::vector<float> in(odd ? 3 : 2, 1.0f);
         std::vector<float> out(in.size() * pg.size());
         return pg.Allgather(in, out);
       },
       "allgather of 3 floats per rank"},
      {"barrier against allreduce",
       [](ProcessGroup& pg, bool odd) {
         std::vector<float> data(4, 1.0f);
         return odd ? pg.Barrier() : pg.Allreduce(data, ReduceOp::kSum);
       },
       "barrier"},
      {"half lengths",
       [](ProcessGroup& pg, bool odd) {
         std::vector<worker::Half> data(odd ? 7 : 6, worker::Half{0x3C00});
         return pg.AllreduceHalf(data, ReduceOp::kSum);
       },
       "half allreduce (sum) of 7 halves"},
      {"fp16 wire against float32",
       [](ProcessGroup& pg, bool odd) {
         auto buf = std::make_shared<worker::Buffer>(32, 1.0f);
         return pg
             .AllreduceAsync(buf, ReduceOp::kAverage,
                             odd ? worker::Precision::kFloat16 : worker::Precision::kFloat32)
             ->Wait();
       },
       "fp16-wire allreduce (average) of 32 floats"},
  };
}

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_MISMATCHED_CALLS_H_
