#include "worker/data/image_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;

bool IsImageFile(const fs::path& p) {
  const std::string ext = absl::AsciiStrToLower(p.extension().string());
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// The class subdirectories of `split` in byte order.
std::vector<std::string> ClassDirectories(const fs::path& split) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(split, ec)) {
    if (e.is_directory(ec)) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Every image of `split`, class by class, labelled by `index`; classes missing from
// `index` are an error.
absl::Status ListImages(const fs::path& split, const std::map<std::string, int64_t>& index,
                        ImageDataset& out) {
  for (const std::string& name : ClassDirectories(split)) {
    auto it = index.find(name);
    if (it == index.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          split.string(), "/", name, " is a class the training split does not have"));
    }
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(split / name, ec)) {
      if (e.is_regular_file(ec) && IsImageFile(e.path())) files.push_back(e.path().string());
    }
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat(split.string(), "/", name, ": cannot list: ", ec.message()));
    }
    std::sort(files.begin(), files.end());
    for (std::string& f : files) {
      out.files.push_back(std::move(f));
      out.labels.push_back(it->second);
    }
  }
  out.size = static_cast<int64_t>(out.files.size());
  return absl::OkStatus();
}

// Keeps `n` examples evenly strided over the list (every class keeps its share).
void KeepStrided(ImageDataset& d, int64_t n) {
  if (n <= 0 || n >= d.size) return;
  std::vector<std::string> files;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t at = i * d.size / n;
    files.push_back(std::move(d.files[at]));
    labels.push_back(d.labels[at]);
  }
  d.files = std::move(files);
  d.labels = std::move(labels);
  d.size = n;
}

// Checks `names` against DIR/classes.txt, writing it when absent.
absl::Status CheckClassIndex(const fs::path& dir, const std::vector<std::string>& names) {
  const fs::path file = dir / "classes.txt";
  std::ifstream in(file);
  if (!in) {
    // First scan: write it (temporary file + rename, so a racing worker sees all or none).
    std::ostringstream text;
    for (const std::string& n : names) text << n << "\n";
    const fs::path tmp = dir / absl::StrCat(".classes.txt.", getpid(), ".", gettid());
    std::ofstream out(tmp);
    out << text.str();
    out.close();
    std::error_code ec;
    if (!out || (fs::rename(tmp, file, ec), ec)) fs::remove(tmp, ec);  // read-only data
    return absl::OkStatus();
  }
  std::vector<std::string> indexed;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    indexed.push_back(line);
  }
  for (size_t i = 0; i < std::max(indexed.size(), names.size()); ++i) {
    const std::string want = i < indexed.size() ? indexed[i] : "(none)";
    const std::string got = i < names.size() ? names[i] : "(none)";
    if (want != got) {
      return absl::DataLossError(absl::StrCat(
          file.string(), " gives class ", i, " as \"", want, "\" but train/ has \"", got,
          "\" there: classes were added or removed since it was written (remove the file "
          "to renumber them)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ImageFolderSplits> ScanImageFolder(const std::string& dir, int image_size,
                                                  int64_t max_train, int64_t max_test) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root / "train", ec)) {
    return absl::NotFoundError(absl::StrCat(dir, "/train: no such directory (want the "
                                            "ImageFolder layout train/CLASS/IMAGE)"));
  }
  const fs::path val = fs::is_directory(root / "val", ec) ? root / "val" : root / "test";
  if (!fs::is_directory(val, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, "/val: no such directory (nor test/)"));
  }
  ImageFolderSplits out;
  out.class_names = ClassDirectories(root / "train");
  if (out.class_names.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/train has no class directories"));
  }
  if (absl::Status s = CheckClassIndex(root, out.class_names); !s.ok()) return s;
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < out.class_names.size(); ++i) {
    index[out.class_names[i]] = static_cast<int64_t>(i);
  }
  for (auto [split, d, max] : {std::tuple{root / "train", &out.train, max_train},
                               std::tuple{val, &out.test, max_test}}) {
    if (absl::Status s = ListImages(split, index, *d); !s.ok()) return s;
    if (d->size == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(split.string(), " has no .jpg, .jpeg or .png images"));
    }
    KeepStrided(*d, max);
    d->channels = 3;
    d->height = image_size;
    d->width = image_size;
    d->classes = static_cast<int>(out.class_names.size());
  }
  return out;
}

absl::StatusOr<std::vector<uint8_t>> ReadWholeFile(const std::string& path, const FileOpener& open,
                                                   int64_t max_bytes) {
  absl::StatusOr<int> fd = open(path);
  if (!fd.ok()) return fd.status();
  const ScopedFd closer(*fd);
  struct stat st;
  if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::DataLossError(absl::StrCat(path, ": not a regular file"));
  }
  if (st.st_size > max_bytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", st.st_size, " bytes, more than the ", max_bytes, " allowed"));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = read(*fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(absl::StrCat(path, ": read failed after ", got, " bytes"));
    }
    got += static_cast<size_t>(n);
  }
  return bytes;
}

}  // namespace joule::worker
