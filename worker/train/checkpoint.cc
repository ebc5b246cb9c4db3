#include "worker/train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/field_mask.pb.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/unknown_field_set.h>
#include <google/protobuf/util/field_mask_util.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;
constexpr char kMagic[8] = {'J', 'O', 'U', 'L', 'E', 'C', 'K', '1'};

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}
// Reads a varint at `*pos`, advancing it; false when the payload ends inside it or it
// runs past 10 bytes.
bool GetVarint(absl::string_view in, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 70 && *pos < in.size(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(in[(*pos)++]);
    *v |= uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// zlib's crc32 takes a 32-bit length: feed it 1 GiB at a time.
uint32_t Crc32(absl::string_view data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (!data.empty()) {
    const size_t n = std::min<size_t>(data.size(), size_t{1} << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(n));
    data.remove_prefix(n);
  }
  return static_cast<uint32_t>(crc);
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

std::string CheckpointDirectory(const std::string& root, int64_t job_id,
                                const std::string& job_uid) {
  if (root.empty()) return "";
  return absl::StrCat(root, "/job-", job_id, job_uid.empty() ? "" : "-" + job_uid);
}

uint64_t SpecHash(const v1::JobSpec& spec) {
  std::string key = absl::StrCat(spec.model(), "|", absl::StrJoin(spec.hidden_sizes(), ","), "|",
                                 spec.dataset(), "|", spec.max_train_samples(), "|",
                                 spec.max_test_samples(), "|", spec.global_batch_size(), "|",
                                 spec.workers(), "|", spec.seed());
  // The optimizer's state (its slots differ): only when it is not sgd, so that the
  // hashes of sgd jobs stay as they were.
  if (spec.optimizer().name() != "sgd" && !spec.optimizer().name().empty()) {
    absl::StrAppend(&key, "|", spec.optimizer().name());
  }
  // A ga job's populations: the algorithm and what shapes them (nothing added for sgd
  // jobs, whose hashes stay as they were).
  if (spec.algorithm() == "ga") {
    const v1::GaSpec& ga = spec.ga();
    absl::StrAppend(&key, "|ga|", ga.population(), "|", ga.fitness_batch(), "|",
                    ga.generations());
  }
  const uLong lo = crc32(0L, reinterpret_cast<const Bytef*>(key.data()), key.size());
  const uLong hi = adler32(1L, reinterpret_cast<const Bytef*>(key.data()), key.size());
  return (uint64_t{hi} << 32) | lo;
}

absl::Status AppendCheckpointPayload(const v1::Checkpoint& checkpoint, size_t max_piece,
                                     std::string* out) {
  namespace pb = google::protobuf;
  if (checkpoint.ByteSizeLong() <= max_piece) {
    if (!checkpoint.AppendToString(out)) {
      return absl::InternalError("checkpoint does not serialize");
    }
    return absl::OkStatus();
  }
  // Field by field, in field-number order as protobuf itself writes them: runs of
  // non-repeated-message fields as one partial message each, every element of a repeated
  // message field (a tensor) as its own tag, length and bytes, unknown fields last.
  const pb::Reflection* reflection = checkpoint.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  reflection->ListFields(checkpoint, &fields);
  pb::FieldMask run;
  auto flush_run = [&]() -> absl::Status {
    if (run.paths_size() == 0) return absl::OkStatus();
    v1::Checkpoint part;
    pb::util::FieldMaskUtil::MergeMessageTo(checkpoint, run, {}, &part);
    const size_t size = part.ByteSizeLong();
    if (size > max_piece) {
      return absl::OutOfRangeError(absl::StrCat(
          "checkpoint fields ", absl::StrJoin(run.paths(), ","), " serialize to ", size,
          " bytes, more than the ", max_piece, " protobuf handles in one piece"));
    }
    run.Clear();
    if (!part.AppendToString(out)) return absl::InternalError("checkpoint does not serialize");
    return absl::OkStatus();
  };
  for (const pb::FieldDescriptor* field : fields) {
    if (!field->is_repeated() || field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      run.add_paths(field->name());
      continue;
    }
    if (absl::Status s = flush_run(); !s.ok()) return s;
    const uint64_t tag = (uint64_t{static_cast<uint32_t>(field->number())} << 3) | 2;
    for (int i = 0; i < reflection->FieldSize(checkpoint, field); ++i) {
      const pb::Message& element = reflection->GetRepeatedMessage(checkpoint, field, i);
      const size_t size = element.ByteSizeLong();
      const size_t record = VarintSize(tag) + VarintSize(size) + size;
      if (record > max_piece) {
        return absl::OutOfRangeError(absl::StrCat(
            "checkpoint field ", field->name(), "[", i, "] serializes to ", record,
            " bytes, more than the ", max_piece, " protobuf handles in one piece"));
      }
      PutVarint(out, tag);
      PutVarint(out, size);
      if (!element.AppendToString(out)) return absl::InternalError("checkpoint does not serialize");
    }
  }
  if (absl::Status s = flush_run(); !s.ok()) return s;
  const pb::UnknownFieldSet& unknown = reflection->GetUnknownFields(checkpoint);
  if (!unknown.empty()) {
    std::string bytes;
    if (!unknown.SerializeToString(&bytes)) {
      return absl::InternalError("checkpoint's unknown fields do not serialize");
    }
    out->append(bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<size_t, size_t>>> SplitCheckpointPayload(
    absl::string_view payload, size_t max_piece) {
  std::vector<std::pair<size_t, size_t>> pieces;
  if (payload.size() <= max_piece) {
    pieces.emplace_back(0, payload.size());
    return pieces;
  }
  // Split at top-level field boundaries; protobuf checks what is inside each field.
  size_t piece = 0, pos = 0;
  while (pos < payload.size()) {
    const size_t field_start = pos;
    uint64_t tag = 0, length = 0;
    auto malformed = [&](absl::string_view what) {
      return absl::DataLossError(absl::StrCat("payload does not parse: ", what,
                                              " in the field at byte ", field_start));
    };
    if (!GetVarint(payload, &pos, &tag)) return malformed("bad tag");
    switch (tag & 7) {
      case 0:  // varint: its bytes are the value
        if (!GetVarint(payload, &pos, &length)) return malformed("bad varint");
        length = 0;
        break;
      case 1:  // fixed64
        length = 8;
        break;
      case 2:  // length-delimited
        if (!GetVarint(payload, &pos, &length)) return malformed("bad length");
        break;
      case 5:  // fixed32
        length = 4;
        break;
      default:  // groups (never in a Checkpoint) or no wire type at all
        return malformed(absl::StrCat("wire type ", tag & 7));
    }
    if (length > payload.size() - pos) return malformed("a value past the end of the payload");
    pos += length;
    if (pos - field_start > max_piece) {
      return absl::DataLossError(absl::StrCat(
          "field ", tag >> 3, " at byte ", field_start, " is ", pos - field_start,
          " bytes, more than the ", max_piece, " protobuf parses in one piece"));
    }
    if (pos - piece > max_piece) {
      pieces.emplace_back(piece, field_start);
      piece = field_start;
    }
  }
  pieces.emplace_back(piece, payload.size());
  return pieces;
}

absl::Status ParseCheckpointPayload(absl::string_view payload, size_t max_piece,
                                    v1::Checkpoint* out) {
  out->Clear();
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> pieces =
      SplitCheckpointPayload(payload, max_piece);
  if (!pieces.ok()) return pieces.status();
  // Parsing the concatenation of two encodings is merging their messages.
  for (const auto& [begin, end] : *pieces) {
    google::protobuf::io::CodedInputStream in(
        reinterpret_cast<const uint8_t*>(payload.data() + begin), static_cast<int>(end - begin));
    if (!out->MergeFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
      return absl::DataLossError(absl::StrCat("payload does not parse (bytes ", begin, " to ", end,
                                              " of ", payload.size(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteCheckpoint(const std::string& dir, const v1::Checkpoint& checkpoint, int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("checkpoint dir ", dir, ": ", ec.message()));
  }
  const std::string final_path =
      absl::StrCat(dir, "/", absl::StrFormat("ckpt-%012d.jck", checkpoint.global_step()));
  std::string bytes(kMagic, sizeof(kMagic));
  PutLe(bytes, 0, 8);  // the payload's length, once known
  bytes.reserve(16 + checkpoint.ByteSizeLong() + 4);
  if (absl::Status s = AppendCheckpointPayload(checkpoint, kMaxPayloadPiece, &bytes); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(final_path, ": ", s.message()));
  }
  const absl::string_view payload = absl::string_view(bytes).substr(16);
  for (int i = 0; i < 8; ++i) bytes[8 + i] = static_cast<char>((payload.size() >> (8 * i)) & 0xff);
  PutLe(bytes, Crc32(payload), 4);
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
  // The whole file in one buffer of its size (checkpoints can exceed 2 GiB).
  std::string bytes;
  {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat("checkpoint ", path, ": cannot open"));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      close(fd);
      return absl::DataLossError(absl::StrCat("checkpoint ", path, ": cannot stat"));
    }
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = read(fd, bytes.data() + off, bytes.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    close(fd);
    bytes.resize(off);
  }
  if (bytes.size() < 20 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": bad magic (not a Joule "
                                            "checkpoint, or truncated to ", bytes.size(),
                                            " bytes)"));
  }
  const uint64_t length = GetLe(bytes.data() + 8, 8);
  if (length != bytes.size() - 20) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": truncated or padded: header "
                                            "says ", length, " payload bytes, file holds ",
                                            bytes.size()));
  }
  const absl::string_view payload = absl::string_view(bytes).substr(16, length);
  const uint32_t want = static_cast<uint32_t>(GetLe(payload.data() + length, 4));
  const uint32_t got = Crc32(payload);
  if (want != got) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": checksum mismatch (stored ",
                                            absl::Hex(want), ", computed ", absl::Hex(got), ")"));
  }
  v1::Checkpoint c;
  if (absl::Status s = ParseCheckpointPayload(payload, kMaxPayloadPiece, &c); !s.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", s.message()));
  }
  return c;
}

absl::StatusOr<v1::Checkpoint> LoadNewestCheckpoint(
    const std::string& dir, uint64_t spec_hash, std::vector<std::string>* skipped,
    const std::function<std::string(const v1::Checkpoint&)>& accept) {
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
    if (accept) {
      if (std::string why = accept(*c); !why.empty()) {
        skipped->push_back(absl::StrCat("checkpoint ", it->string(), ": ", why));
        continue;
      }
    }
    return c;
  }
  return absl::NotFoundError(absl::StrCat("no usable checkpoint in ", dir));
}

}  // namespace joule::worker
