#include "worker/data/idx.h"

#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {
constexpr size_t kMaxFileBytes = size_t{1} << 30;
}

absl::StatusOr<IdxArray> ParseIdx(std::string_view bytes, const std::string& name) {
  if (bytes.size() < 4) {
    return absl::DataLossError(
        absl::StrCat(name, ": truncated: ", bytes.size(), " bytes, too short for an IDX header"));
  }
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  if (b[0] != 0 || b[1] != 0) {
    return absl::DataLossError(absl::StrCat(name, ": not an IDX file (magic 0x",
                                            absl::Hex(b[0], absl::kZeroPad2),
                                            absl::Hex(b[1], absl::kZeroPad2), "..., want 0x0000...)"));
  }
  if (b[2] != 0x08) {
    return absl::DataLossError(absl::StrCat(name, ": IDX element type 0x",
                                            absl::Hex(b[2], absl::kZeroPad2),
                                            " is not unsigned byte (0x08)"));
  }
  const uint32_t ndim = b[3];
  if (ndim < 1 || ndim > 4) {
    return absl::DataLossError(absl::StrCat(name, ": IDX has ", ndim, " dimensions (want 1..4)"));
  }
  const size_t header = 4 + 4 * size_t{ndim};
  if (bytes.size() < header) {
    return absl::DataLossError(absl::StrCat(name, ": truncated: the IDX header needs ", header,
                                            " bytes, the file has ", bytes.size()));
  }
  IdxArray out;
  uint64_t elements = 1;
  for (uint32_t i = 0; i < ndim; ++i) {
    const uint8_t* d = b + 4 + 4 * i;
    uint32_t dim = (uint32_t{d[0]} << 24) | (uint32_t{d[1]} << 16) | (uint32_t{d[2]} << 8) | d[3];
    if (dim == 0) return absl::DataLossError(absl::StrCat(name, ": dimension ", i, " is 0"));
    out.dims.push_back(dim);
    elements *= dim;
    if (elements > kMaxFileBytes) {
      return absl::DataLossError(absl::StrCat(name, ": IDX header promises more than ",
                                              kMaxFileBytes, " bytes"));
    }
  }
  const size_t have = bytes.size() - header;
  if (have < elements) {
    return absl::DataLossError(absl::StrCat(name, ": truncated: the header promises ", elements,
                                            " data bytes, the file has ", have));
  }
  if (have > elements) {
    return absl::DataLossError(absl::StrCat(name, ": ", have - elements,
                                            " bytes after the data the header describes"));
  }
  out.data.assign(b + header, b + header + elements);
  return out;
}

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, const FileOpener& open) {
  absl::StatusOr<int> fd = open(path);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(*fd);
    return absl::NotFoundError(absl::StrCat(path, ": not a regular file"));
  }
  gzFile f = gzdopen(*fd, "rb");  // owns the descriptor from here
  if (f == nullptr) {
    close(*fd);
    return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  }
  std::string bytes;
  char buf[1 << 16];
  while (true) {
    int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int errnum = 0;
      std::string msg = gzerror(f, &errnum);
      gzclose(f);
      return absl::DataLossError(absl::StrCat(path, ": corrupt gzip stream: ", msg));
    }
    if (n == 0) break;
    bytes.append(buf, n);
    if (bytes.size() > kMaxFileBytes) {
      gzclose(f);
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": more than ", kMaxFileBytes, " bytes uncompressed"));
    }
  }
  int rc = gzclose(f);
  if (rc == Z_BUF_ERROR) {
    return absl::DataLossError(absl::StrCat(path, ": truncated gzip stream"));
  }
  if (rc != Z_OK) {
    return absl::DataLossError(absl::StrCat(path, ": gzip error ", rc, " on close"));
  }
  return ParseIdx(bytes, path);
}

}  // namespace joule::worker
