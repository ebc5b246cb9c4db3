#include "worker/models/models.h"

#include "absl/strings/str_cat.h"

namespace joule::worker {

absl::StatusOr<torch::nn::Sequential> BuildModel(const std::string& name,
                                                 const std::vector<int>& hidden,
                                                 const InputShape& shape) {
  namespace nn = torch::nn;
  const int64_t in = int64_t{shape.channels} * shape.height * shape.width;
  nn::Sequential model;
  if (name == "logreg") {
    model->push_back(nn::Flatten());
    model->push_back(nn::Linear(in, shape.classes));
  } else if (name == "mlp") {
    model->push_back(nn::Flatten());
    int64_t width = in;
    for (int h : hidden) {
      model->push_back(nn::Linear(width, h));
      model->push_back(nn::ReLU());
      width = h;
    }
    model->push_back(nn::Linear(width, shape.classes));
  } else if (name == "cnn") {
    if (shape.height < 6 || shape.width < 6) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cnn needs images of at least 6x6, got ", shape.height, "x", shape.width));
    }
    const int64_t h = (shape.height - 4) / 2, w = (shape.width - 4) / 2;
    model->push_back(nn::Conv2d(nn::Conv2dOptions(shape.channels, 32, 3)));
    model->push_back(nn::ReLU());
    model->push_back(nn::Conv2d(nn::Conv2dOptions(32, 64, 3)));
    model->push_back(nn::ReLU());
    model->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2)));
    model->push_back(nn::Flatten());
    model->push_back(nn::Linear(64 * h * w, 128));
    model->push_back(nn::ReLU());
    model->push_back(nn::Linear(128, shape.classes));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("model \"", name, "\" is unknown (want logreg, mlp or cnn)"));
  }
  return model;
}

}  // namespace joule::worker
