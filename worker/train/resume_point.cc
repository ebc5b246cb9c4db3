#include "worker/train/resume_point.h"

#include <bit>
#include <vector>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

constexpr size_t kEpochAt = 1, kStepInEpochAt = 5, kGlobalStepAt = 13, kMomentumAt = 21,
                 kAccuracyAt = 22, kPlateauAt = 30, kScaleAt = 31, kBestAt = 39,
                 kBadEpochsAt = 47;

void PutLittleEndian(uint64_t v, size_t bytes, uint8_t* out) {
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t GetLittleEndian(const uint8_t* in, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= uint64_t{in[i]} << (8 * i);
  return v;
}

}  // namespace

ResumePointBytes EncodeResumePoint(const std::optional<ResumePoint>& point) {
  ResumePointBytes out{};
  if (!point.has_value()) return out;
  out[0] = 1;
  PutLittleEndian(static_cast<uint32_t>(point->next_epoch), 4, &out[kEpochAt]);
  PutLittleEndian(static_cast<uint64_t>(point->next_step_in_epoch), 8, &out[kStepInEpochAt]);
  PutLittleEndian(static_cast<uint64_t>(point->global_step), 8, &out[kGlobalStepAt]);
  out[kMomentumAt] = point->has_optimizer_state ? 1 : 0;
  PutLittleEndian(std::bit_cast<uint64_t>(point->test_accuracy), 8, &out[kAccuracyAt]);
  out[kPlateauAt] = point->has_plateau ? 1 : 0;
  PutLittleEndian(std::bit_cast<uint64_t>(point->plateau.scale), 8, &out[kScaleAt]);
  PutLittleEndian(std::bit_cast<uint64_t>(point->plateau.best), 8, &out[kBestAt]);
  PutLittleEndian(static_cast<uint32_t>(point->plateau.bad_epochs), 4, &out[kBadEpochsAt]);
  return out;
}

absl::StatusOr<std::optional<ResumePoint>> DecodeResumePoint(const ResumePointBytes& bytes) {
  if (bytes[0] > 1 || bytes[kMomentumAt] > 1 || bytes[kPlateauAt] > 1) {
    return absl::DataLossError(absl::StrCat("resume point: flag bytes are ", int{bytes[0]}, ", ",
                                            int{bytes[kMomentumAt]}, " and ",
                                            int{bytes[kPlateauAt]}, ", expected 0 or 1"));
  }
  if (bytes[0] == 0) {
    for (size_t i = 1; i < bytes.size(); ++i) {
      if (bytes[i] != 0) {
        return absl::DataLossError(
            absl::StrCat("resume point: no checkpoint, yet byte ", i, " is ", int{bytes[i]}));
      }
    }
    return std::optional<ResumePoint>();
  }
  ResumePoint p;
  p.next_epoch = static_cast<int32_t>(static_cast<uint32_t>(GetLittleEndian(&bytes[kEpochAt], 4)));
  p.next_step_in_epoch = static_cast<int64_t>(GetLittleEndian(&bytes[kStepInEpochAt], 8));
  p.global_step = static_cast<int64_t>(GetLittleEndian(&bytes[kGlobalStepAt], 8));
  p.has_optimizer_state = bytes[kMomentumAt] == 1;
  p.test_accuracy = std::bit_cast<double>(GetLittleEndian(&bytes[kAccuracyAt], 8));
  p.has_plateau = bytes[kPlateauAt] == 1;
  p.plateau.scale = std::bit_cast<double>(GetLittleEndian(&bytes[kScaleAt], 8));
  p.plateau.best = std::bit_cast<double>(GetLittleEndian(&bytes[kBestAt], 8));
  p.plateau.bad_epochs =
      static_cast<int32_t>(static_cast<uint32_t>(GetLittleEndian(&bytes[kBadEpochsAt], 4)));
  return std::optional<ResumePoint>(p);
}

absl::Status BroadcastResumePoint(ProcessGroup& pg, int root, std::optional<ResumePoint>* point) {
  std::vector<float> wire(kResumePointBytes, 0.0f);
  if (pg.rank() == root) {
    const ResumePointBytes bytes = EncodeResumePoint(*point);
    for (size_t i = 0; i < bytes.size(); ++i) wire[i] = static_cast<float>(bytes[i]);
  }
  if (absl::Status s = pg.Broadcast(wire, root); !s.ok()) return s;
  ResumePointBytes bytes{};
  for (size_t i = 0; i < bytes.size(); ++i) {
    const float f = wire[i];
    if (!(f >= 0.0f && f <= 255.0f) || f != static_cast<float>(static_cast<int>(f))) {
      return absl::DataLossError(
          absl::StrCat("resume point: element ", i, " arrived as ", f, ", not a byte"));
    }
    bytes[i] = static_cast<uint8_t>(f);
  }
  absl::StatusOr<std::optional<ResumePoint>> decoded = DecodeResumePoint(bytes);
  if (!decoded.ok()) return decoded.status();
  *point = *decoded;
  return absl::OkStatus();
}

}  // namespace joule::worker
