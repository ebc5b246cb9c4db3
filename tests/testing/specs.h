#ifndef JOULE_TESTS_TESTING_SPECS_H_
#define JOULE_TESTS_TESTING_SPECS_H_

#include "joule/v1/job.pb.h"

namespace joule::testing {

// The smallest real job the coordinator's tests submit: an mlp on Fashion-MNIST, one
// epoch, local batch 64 on each of `workers`, SGD at lr 0.05. Valid as it is.
inline v1::JobSpec SmallMlpSpec(int workers) {
  v1::JobSpec s;
  s.set_model("mlp");
  s.set_dataset("fashion-mnist");
  s.set_workers(workers);
  s.set_global_batch_size(64 * workers);
  s.set_epochs(1);
  s.mutable_optimizer()->set_lr(0.05);
  return s;
}

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_SPECS_H_
