#include "worker/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;
constexpr char kMagic[8] = {'J', 'O', 'U', 'L', 'E', 'C', 'K', '1'};
constexpr uint64_t kMaxPayload = uint64_t{4} << 30;

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

absl::Status Unavailable(const std::string& path, const std::string& what) {
  return absl::UnavailableError(absl::StrCat("checkpoint ", path, ": ", what, ": ",
                                             std::strerror(errno)));
}

absl::Status FsyncPath(const std::string& path, int flags) {
  int fd = open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Unavailable(path, "open for fsync");
  int rc = fsync(fd);
  close(fd);
  if (rc != 0) return Unavailable(path, "fsync");
  return absl::OkStatus();
}

std::vector<fs::path> CheckpointFiles(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, "ckpt-") && absl::EndsWith(name, ".jck")) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());  // zero-padded steps: name order is step order
  return files;
}

}  // namespace

uint64_t SpecHash(const v1::JobSpec& spec) {
  std::string key = absl::StrCat(spec.model(), "|", absl::StrJoin(spec.hidden_sizes(), ","), "|",
                                 spec.dataset(), "|", spec.max_train_samples(), "|",
                                 spec.max_test_samples(), "|", spec.global_batch_size(), "|",
                                 spec.workers(), "|", spec.seed());
  const uLong lo = crc32(0L, reinterpret_cast<const Bytef*>(key.data()), key.size());
  const uLong hi = adler32(1L, reinterpret_cast<const Bytef*>(key.data()), key.size());
  return (uint64_t{hi} << 32) | lo;
}

absl::Status WriteCheckpoint(const std::string& dir, const v1::Checkpoint& checkpoint, int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("checkpoint dir ", dir, ": ", ec.message()));
  }
  const std::string payload = checkpoint.SerializeAsString();
  std::string bytes(kMagic, sizeof(kMagic));
  PutLe(bytes, payload.size(), 8);
  bytes += payload;
  PutLe(bytes, crc32(0L, reinterpret_cast<const Bytef*>(payload.data()), payload.size()), 4);

  const std::string final_path =
      absl::StrCat(dir, "/", absl::StrFormat("ckpt-%012d.jck", checkpoint.global_step()));
  const std::string tmp = absl::StrCat(final_path, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Unavailable(tmp, "create");
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = Unavailable(tmp, "write");
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    off += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    absl::Status s = Unavailable(tmp, "fsync");
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  close(fd);
  if (rename(tmp.c_str(), final_path.c_str()) != 0) {
    absl::Status s = Unavailable(final_path, "rename");
    unlink(tmp.c_str());
    return s;
  }
  if (absl::Status s = FsyncPath(dir, O_RDONLY | O_DIRECTORY); !s.ok()) return s;

  // Keep the file just written and the keep-1 newest before it; never touch files with a
  // higher step (garbage, or a deposed writer's), which resume skips or weighs on its own.
  std::vector<fs::path> older;
  for (const fs::path& f : CheckpointFiles(dir)) {
    if (f.filename().string() < fs::path(final_path).filename().string()) older.push_back(f);
  }
  const size_t keep_older = static_cast<size_t>(std::max(1, keep) - 1);
  for (size_t i = 0; i + keep_older < older.size(); ++i) fs::remove(older[i], ec);
  return absl::OkStatus();
}

absl::StatusOr<v1::Checkpoint> ReadCheckpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("checkpoint ", path, ": cannot open"));
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string bytes = ss.str();
  if (bytes.size() < 20 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": bad magic (not a Joule "
                                            "checkpoint, or truncated to ", bytes.size(),
                                            " bytes)"));
  }
  const uint64_t length = GetLe(bytes.data() + 8, 8);
  if (length > kMaxPayload || bytes.size() != 16 + length + 4) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": truncated or padded: header "
                                            "says ", length, " payload bytes, file holds ",
                                            bytes.size()));
  }
  const char* payload = bytes.data() + 16;
  const uint32_t want = static_cast<uint32_t>(GetLe(payload + length, 4));
  const uint32_t got = static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(payload), static_cast<uInt>(length)));
  if (want != got) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": checksum mismatch (stored ",
                                            absl::Hex(want), ", computed ", absl::Hex(got), ")"));
  }
  v1::Checkpoint c;
  if (!c.ParseFromArray(payload, static_cast<int>(length))) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": payload does not parse"));
  }
  return c;
}

absl::StatusOr<v1::Checkpoint> LoadNewestCheckpoint(const std::string& dir, uint64_t spec_hash,
                                                    std::vector<std::string>* skipped) {
  std::vector<fs::path> files = CheckpointFiles(dir);
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    absl::StatusOr<v1::Checkpoint> c = ReadCheckpoint(it->string());
    if (!c.ok()) {
      skipped->push_back(std::string(c.status().message()));
      continue;
    }
    if (c->spec_hash() != spec_hash) {
      skipped->push_back(absl::StrCat("checkpoint ", it->string(),
                                      ": written for a different job shape (spec hash ",
                                      absl::Hex(c->spec_hash()), ", want ",
                                      absl::Hex(spec_hash), ")"));
      continue;
    }
    return c;
  }
  return absl::NotFoundError(absl::StrCat("no usable checkpoint in ", dir));
}

}  // namespace joule::worker
