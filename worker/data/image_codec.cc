#include "worker/data/image_codec.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

absl::Status Corrupt(const std::string& name, const std::string& why) {
  return absl::DataLossError(absl::StrCat(name, ": ", why));
}

absl::Status CheckDimensions(const std::string& name, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0 || width > kMaxImageSide || height > kMaxImageSide ||
      width * height > kMaxImagePixels) {
    return Corrupt(name, absl::StrCat("image dimensions ", width, "x", height,
                                      " are outside 1..", kMaxImageSide, " per side and ",
                                      kMaxImagePixels, " pixels"));
  }
  return absl::OkStatus();
}

bool IsJpeg(std::span<const uint8_t> b) {
  return b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}

bool IsPng(std::span<const uint8_t> b) {
  return b.size() >= 8 && png_sig_cmp(b.data(), 0, 8) == 0;
}

// ---- JPEG (libjpeg's error handling longjmps: the decoding functions below keep only
// trivially destructible locals between setjmp and the calls that may jump).

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;  // libjpeg's "premature end" warning: Pillow refuses such files too
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// A progressive JPEG of many tiny scans costs a full pass each: a small crafted file
// could keep a thread busy for minutes. Real files have about 10 scans.
constexpr int kMaxJpegScans = 1000;

void JpegProgress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxJpegScans) {
    auto* e = reinterpret_cast<JpegError*>(cinfo->err);
    std::snprintf(e->message, sizeof(e->message), "more than %d progressive scans",
                  kMaxJpegScans);
    std::longjmp(e->jump, 1);
  }
}

void JpegEmitMessage(j_common_ptr cinfo, int level) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) e->truncated = true;
  if (level < 0) ++cinfo->err->num_warnings;
}

int ValidScale(int d) { return d == 2 || d == 4 || d == 8 ? d : 1; }

// Reads the header and sets the output parameters. Returns false after a libjpeg error
// (then `e.message` says why). `out` receives the pixels when `pixels` is set.
bool RunJpeg(std::span<const uint8_t> bytes, int scale, bool pixels, JpegError& e,
             ImageSize& size, std::vector<uint8_t>* out, bool& unsupported) {
  jpeg_decompress_struct cinfo;
  jpeg_progress_mgr progress;
  progress.progress_monitor = JpegProgress;
  cinfo.err = jpeg_std_error(&e.mgr);
  e.mgr.error_exit = JpegErrorExit;
  e.mgr.emit_message = JpegEmitMessage;
  e.truncated = false;
  e.message[0] = '\0';
  if (setjmp(e.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  cinfo.progress = &progress;
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    unsupported = true;
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned int>(scale);
  jpeg_calc_output_dimensions(&cinfo);
  size = {static_cast<int>(cinfo.output_width), static_cast<int>(cinfo.output_height)};
  if (!pixels || CheckDimensions("", size.width, size.height).ok() == false) {
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  out->resize(static_cast<size_t>(size.width) * size.height * 3);
  jpeg_start_decompress(&cinfo);
  const size_t stride = static_cast<size_t>(size.width) * 3;
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->data() + cinfo.output_scanline * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

absl::StatusOr<RgbImage> DecodeJpeg(std::span<const uint8_t> bytes, const std::string& name,
                                    int scale, bool pixels) {
  JpegError e;
  ImageSize size;
  RgbImage image;
  bool unsupported = false;
  if (!RunJpeg(bytes, scale, pixels, e, size, &image.pixels, unsupported)) {
    return Corrupt(name, absl::StrCat("corrupt JPEG: ", e.message));
  }
  if (unsupported) return Corrupt(name, "CMYK JPEG images are not supported");
  if (absl::Status s = CheckDimensions(name, size.width, size.height); !s.ok()) return s;
  if (e.truncated) return Corrupt(name, "truncated JPEG (premature end of data)");
  image.width = size.width;
  image.height = size.height;
  return image;
}

// ---- PNG (libpng's error handling longjmps too).

struct PngReader {
  std::span<const uint8_t> bytes;
  size_t offset = 0;
  char message[256];
};

void PngRead(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (r->bytes.size() - r->offset < n) png_error(png, "truncated PNG (premature end of data)");
  std::memcpy(out, r->bytes.data() + r->offset, n);
  r->offset += n;
}

void PngError(png_structp png, png_const_charp message) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof(r->message), "%s", message);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}

bool RunPng(PngReader& reader, bool pixels, ImageSize& size, std::vector<uint8_t>* out,
            std::vector<png_bytep>* rows) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, PngError, PngWarning);
  if (png == nullptr) {
    std::snprintf(reader.message, sizeof(reader.message), "libpng could not start");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, &reader, PngRead);
  // Dimensions within the limits before libpng allocates anything for rows.
  png_set_user_limits(png, kMaxImageSide, kMaxImageSide);
  png_read_info(png, info);
  size = {static_cast<int>(png_get_image_width(png, info)),
          static_cast<int>(png_get_image_height(png, info))};
  if (!pixels || !CheckDimensions("", size.width, size.height).ok()) {
    png_destroy_read_struct(&png, &info, nullptr);
    return true;
  }
  const int color = png_get_color_type(png, info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8) {
    png_set_expand_gray_1_2_4_to_8(png);
  }
  if (png_get_bit_depth(png, info) == 16) png_set_strip_16(png);  // the high byte
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) {
    png_set_gray_to_rgb(png);
  }
  png_set_strip_alpha(png);  // alpha, and tRNS as expanded with the palette
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_channels(png, info) != 3 || png_get_rowbytes(png, info) !=
                                              static_cast<png_size_t>(size.width) * 3) {
    std::snprintf(reader.message, sizeof(reader.message), "unexpected PNG layout");
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  out->resize(static_cast<size_t>(size.width) * size.height * 3);
  rows->resize(static_cast<size_t>(size.height));
  for (int y = 0; y < size.height; ++y) {
    (*rows)[y] = out->data() + static_cast<size_t>(y) * size.width * 3;
  }
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

absl::StatusOr<RgbImage> DecodePng(std::span<const uint8_t> bytes, const std::string& name,
                                   bool pixels) {
  PngReader reader{bytes, 0, {}};
  reader.message[0] = '\0';
  ImageSize size;
  RgbImage image;
  std::vector<png_bytep> rows;
  if (!RunPng(reader, pixels, size, &image.pixels, &rows)) {
    return Corrupt(name, absl::StrCat("corrupt PNG: ", reader.message));
  }
  if (absl::Status s = CheckDimensions(name, size.width, size.height); !s.ok()) return s;
  image.width = size.width;
  image.height = size.height;
  return image;
}

absl::StatusOr<RgbImage> Decode(std::span<const uint8_t> bytes, const std::string& name,
                                int scale, bool pixels) {
  if (IsJpeg(bytes)) return DecodeJpeg(bytes, name, ValidScale(scale), pixels);
  if (IsPng(bytes)) return DecodePng(bytes, name, pixels);
  return Corrupt(name, bytes.empty() ? "empty file" : "neither a JPEG nor a PNG image");
}

}  // namespace

absl::StatusOr<RgbImage> DecodeImage(std::span<const uint8_t> bytes, const std::string& name,
                                     int scale_denominator) {
  return Decode(bytes, name, scale_denominator, /*pixels=*/true);
}

absl::StatusOr<ImageSize> ReadImageSize(std::span<const uint8_t> bytes, const std::string& name,
                                        int scale_denominator) {
  absl::StatusOr<RgbImage> header = Decode(bytes, name, scale_denominator, /*pixels=*/false);
  if (!header.ok()) return header.status();
  return ImageSize{header->width, header->height};
}

}  // namespace joule::worker
