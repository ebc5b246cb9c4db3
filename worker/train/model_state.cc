#include "worker/train/model_state.h"

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace joule::worker {

int64_t ModelTensors::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters) n += p.numel();
  return n;
}

ModelTensors CollectModelTensors(Model& model) {
  ModelTensors t;
  for (auto& [name, p] : model.Parameters()) {
    t.parameter_names.push_back(name);
    t.parameters.push_back(p);
  }
  for (auto& [name, b] : model.Buffers()) {
    t.statistic_names.push_back(name);
    t.statistics.push_back(b);
  }
  return t;
}

void Pack(const std::vector<torch::Tensor>& tensors, torch::Tensor& flat) {
  int64_t off = 0;
  for (const auto& t : tensors) {
    flat.narrow(0, off, t.numel()).copy_(t.reshape(-1));
    off += t.numel();
  }
}

void Unpack(const torch::Tensor& flat, std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  int64_t off = 0;
  for (auto& t : tensors) {
    t.view(-1).copy_(flat.narrow(0, off, t.numel()));
    off += t.numel();
  }
}

absl::Status SyncTensors(ProcessGroup& pg, std::vector<torch::Tensor>& ts, bool average) {
  if (ts.empty() || pg.size() == 1) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<float> flat;
  for (const auto& t : ts) {
    torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    flat.insert(flat.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  absl::Status s = average ? pg.Allreduce(flat, ReduceOp::kAverage) : pg.Broadcast(flat, 0);
  if (!s.ok()) return s;
  size_t off = 0;
  for (auto& t : ts) {
    t.copy_(torch::from_blob(flat.data() + off, t.sizes(), torch::kFloat32));
    off += static_cast<size_t>(t.numel());
  }
  return absl::OkStatus();
}

ParameterExchange::ParameterExchange(int64_t parameter_count, CollectiveObserver on_collective,
                                     const joule::Clock& clock)
    : flat_(torch::zeros({parameter_count}, torch::kFloat32)),
      on_collective_(std::move(on_collective)),
      clock_(clock) {}

absl::Status ParameterExchange::Broadcast(ProcessGroup& pg, std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  Pack(tensors, flat_);
  std::span<float> data(flat_.data_ptr<float>(), static_cast<size_t>(flat_.numel()));
  const joule::Clock::TimePoint t0 = clock_.Now();
  if (absl::Status s = pg.Broadcast(data, 0); !s.ok()) return s;
  if (on_collective_) {
    on_collective_("broadcast", flat_.numel() * static_cast<int64_t>(sizeof(float)),
                   joule::Seconds(clock_.Now() - t0));
  }
  Unpack(flat_, tensors);
  return absl::OkStatus();
}

absl::Status ParameterExchange::Average(ProcessGroup& pg, std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  Pack(tensors, flat_);
  std::span<float> data(flat_.data_ptr<float>(), static_cast<size_t>(flat_.numel()));
  const joule::Clock::TimePoint t0 = clock_.Now();
  if (absl::Status s = pg.AllreduceSum(data); !s.ok()) return s;
  if (on_collective_) {
    on_collective_("average", flat_.numel() * static_cast<int64_t>(sizeof(float)),
                   joule::Seconds(clock_.Now() - t0));
  }
  flat_.mul_(1.0f / static_cast<float>(pg.size()));
  Unpack(flat_, tensors);
  return absl::OkStatus();
}

std::string Fingerprint(Model& model, const InputShape& shape, int world, int64_t train_size,
                        int64_t test_size) {
  std::string out = absl::StrCat("world=", world, " input=", shape.channels, "x", shape.height,
                                 "x", shape.width, " classes=", shape.classes, " | train=",
                                 train_size, " test=", test_size);
  auto append = [&](const char* kind, const NamedTensors& tensors) {
    for (const auto& [name, t] : tensors) {
      absl::StrAppend(&out, " | ", kind, name, ":");
      const auto sizes = t.sizes();
      for (size_t i = 0; i < sizes.size(); ++i) absl::StrAppend(&out, i ? "x" : "", sizes[i]);
      absl::StrAppend(&out, ":", std::string(c10::toString(t.scalar_type())));
    }
  };
  append("", model.Parameters());
  // The buffers that are averaged and hashed (BatchNorm statistics) must line up too.
  append("buffer ", model.Buffers());
  return out;
}

std::string FirstDifference(const std::string& a, const std::string& b) {
  std::vector<std::string> fa = absl::StrSplit(a, " | "), fb = absl::StrSplit(b, " | ");
  for (size_t i = 0; i < std::max(fa.size(), fb.size()); ++i) {
    const std::string x = i < fa.size() ? fa[i] : "(nothing)";
    const std::string y = i < fb.size() ? fb[i] : "(nothing)";
    if (x != y) return absl::StrCat(y, " where rank 0 has ", x);
  }
  return "identical";
}

absl::Status CheckFingerprints(const std::vector<std::string>& fingerprints) {
  for (size_t r = 1; r < fingerprints.size(); ++r) {
    if (fingerprints[r] != fingerprints[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", r, " differs from rank 0: ", FirstDifference(fingerprints[0], fingerprints[r])));
    }
  }
  return absl::OkStatus();
}

uint32_t ParameterHash(Model& model) {
  uLong crc = crc32(0L, Z_NULL, 0);
  NamedTensors all = model.Parameters();
  for (auto& b : model.Buffers()) all.push_back(std::move(b));
  for (const auto& [name, p] : all) {
    torch::Tensor c = p.detach().to(torch::kCPU).contiguous();
    crc = crc32(crc, reinterpret_cast<const Bytef*>(c.data_ptr<float>()),
                static_cast<uInt>(c.numel() * sizeof(float)));
  }
  return static_cast<uint32_t>(crc);
}

std::string HashText(uint32_t hash) { return absl::StrCat(absl::Hex(hash, absl::kZeroPad8)); }

absl::Status CompareParameterHashes(ProcessGroup& pg, uint32_t hash) {
  // 16-bit halves: exact in float32.
  const float mine[2] = {static_cast<float>(hash >> 16), static_cast<float>(hash & 0xFFFF)};
  std::vector<float> all(2 * static_cast<size_t>(pg.size()));
  if (absl::Status s = pg.Allgather(mine, all); !s.ok()) return s;
  std::vector<uint32_t> hashes(pg.size());
  for (int r = 0; r < pg.size(); ++r) {
    hashes[r] = (static_cast<uint32_t>(all[2 * r]) << 16) | static_cast<uint32_t>(all[2 * r + 1]);
  }
  std::string differ;
  for (int r = 1; r < pg.size(); ++r) {
    if (hashes[r] != hashes[0]) {
      absl::StrAppend(&differ, differ.empty() ? "" : ", ", "rank ", r, " has ",
                      HashText(hashes[r]));
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat("the ranks ended training with different parameters: rank 0 has hash ",
                   HashText(hashes[0]), ", ", differ));
}

}  // namespace joule::worker
