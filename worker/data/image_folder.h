#ifndef JOULE_WORKER_DATA_IMAGE_FOLDER_H_
#define JOULE_WORKER_DATA_IMAGE_FOLDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/data/open_beneath.h"

namespace joule::worker {

// A directory in torchvision's ImageFolder layout, as ImageNet-2012 is laid out for it:
//   DIR/train/CLASS/*.{jpg,jpeg,png}   (any case; other files are ignored)
//   DIR/val/CLASS/...                  (or DIR/test/ when there is no val/)
// Classes are the train/ subdirectories in byte order, indexed from 0 (torchvision's
// find_classes); files are taken in byte order within a class. A class index file,
// DIR/classes.txt (one class name per line, line i = index i), is written on the first
// scan when the directory is writable (atomically: any number of workers may race) and
// checked on every later one, so that a class directory added or removed later fails
// the job instead of silently renumbering the labels.
//
// Returns file-backed splits (dataset.h): `files` and `labels`, `classes`, and
// channels/height/width = 3 x `image_size` x `image_size` (the transform's output).
// `max_train` / `max_test` > 0 keep that many examples, evenly strided over the sorted
// list so that every class keeps its share. Only directories are listed here; the files
// are opened later, through the worker's FileOpener (beneath its roots).
// Errors: NOT_FOUND when DIR/train is missing; INVALID_ARGUMENT when a split has no
// images or val/ holds a class train/ does not; DATA_LOSS when classes.txt disagrees
// with the class directories (naming the first difference) or is malformed.
struct ImageFolderSplits {
  ImageDataset train;
  ImageDataset test;
  std::vector<std::string> class_names;
};
absl::StatusOr<ImageFolderSplits> ScanImageFolder(const std::string& dir, int image_size,
                                                  int64_t max_train, int64_t max_test);

// The whole file `path` opened with `open`, at most `max_bytes` long. Errors: the
// opener's; DATA_LOSS (naming the file) when it is longer or a read fails.
absl::StatusOr<std::vector<uint8_t>> ReadWholeFile(const std::string& path, const FileOpener& open,
                                                   int64_t max_bytes);

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_IMAGE_FOLDER_H_
