#ifndef JOULE_WORKER_TRAIN_RESUME_POINT_H_
#define JOULE_WORKER_TRAIN_RESUME_POINT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "absl/status/statusor.h"
#include "worker/train/lr_schedule.h"
#include "worker/comm/process_group.h"

namespace joule::worker {

// Where an attempt resumes: the position of the checkpoint rank 0 restored. Plain values
// (what a joule.v1.Checkpoint says besides its tensors).
struct ResumePoint {
  int32_t next_epoch = 0;          // 0-based epoch of the next step
  int64_t next_step_in_epoch = 0;  // step within that epoch to run next
  int64_t global_step = 0;         // gradient updates done
  bool has_optimizer_state = false;  // the checkpoint held the optimizer's state
  double test_accuracy = -1;       // after the last finished epoch; -1 if none
  // A plateau learning-rate schedule's state after the last finished epoch, when the
  // checkpoint held one (LrSchedule::set_plateau).
  bool has_plateau = false;
  PlateauState plateau;
  bool operator==(const ResumePoint&) const = default;
};

// The resume point on the wire, kResumePointBytes bytes, integers little-endian two's
// complement (every value of every field round-trips exactly):
//   byte  0       0: no checkpoint (the other bytes are zero), 1: a ResumePoint follows
//   bytes 1..4    next_epoch, int32
//   bytes 5..12   next_step_in_epoch, int64
//   bytes 13..20  global_step, int64
//   byte  21      has_optimizer_state, 0 or 1
//   bytes 22..29  test_accuracy, the IEEE 754 binary64 bit pattern
//   byte  30      has_plateau, 0 or 1
//   bytes 31..38  plateau.scale, binary64
//   bytes 39..46  plateau.best, binary64
//   bytes 47..50  plateau.bad_epochs, int32
inline constexpr size_t kResumePointBytes = 51;
using ResumePointBytes = std::array<uint8_t, kResumePointBytes>;

ResumePointBytes EncodeResumePoint(const std::optional<ResumePoint>& point);
// Errors: DATA_LOSS when byte 0, 21 or 30 is not 0 or 1, or byte 0 is 0 and any other
// byte is not.
absl::StatusOr<std::optional<ResumePoint>> DecodeResumePoint(const ResumePointBytes& bytes);

// Collective: `root`'s *point (nullopt: start from scratch) becomes every rank's, exactly.
// The encoding travels as kResumePointBytes floats through ProcessGroup::Broadcast, one
// byte per float (0..255: exact in float32 on every transport). On the root *point is
// read, on the others written. Errors: the group's; DATA_LOSS when what arrives is not
// an encoding (a float that is not a byte). Not thread-safe (one collective on `pg`).
absl::Status BroadcastResumePoint(ProcessGroup& pg, int root, std::optional<ResumePoint>* point);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_RESUME_POINT_H_
