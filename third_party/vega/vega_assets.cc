#include "third_party/vega/vega_assets.h"

#include <cstddef>
#include <cstdint>

#ifndef JOULE_VEGA_DIR
#error "JOULE_VEGA_DIR (the absolute path of third_party/vega) must be defined by the build"
#endif

// Each file is pulled in whole by the assembler into .rodata between a start and an end
// symbol (global but hidden, so position-independent code reaches them directly). A NUL byte
// follows each end symbol, outside the view, so the data never runs into the next blob when
// handed to C APIs by mistake; the views below stop at the end symbol: exactly the file bytes.
// (STT_OBJECT and the section's default type keep the directives portable across ELF targets.)
#define JOULE_VEGA_INCBIN(sym, file)                                  \
  ".global " #sym "_start\n"                                          \
  ".hidden " #sym "_start\n"                                          \
  ".type " #sym "_start, STT_OBJECT\n"                                \
  ".global " #sym "_end\n"                                            \
  ".hidden " #sym "_end\n"                                            \
  ".type " #sym "_end, STT_OBJECT\n"                                  \
  ".balign 16\n"                                                      \
  #sym "_start:\n"                                                    \
  ".incbin \"" JOULE_VEGA_DIR "/" file "\"\n"                         \
  #sym "_end:\n"                                                      \
  ".size " #sym "_start, " #sym "_end - " #sym "_start\n"             \
  ".byte 0\n"

asm(".pushsection .rodata, \"a\"\n"
    JOULE_VEGA_INCBIN(joule_vega_js, "vega.min.js")
    JOULE_VEGA_INCBIN(joule_vega_lite_js, "vega-lite.min.js")
    JOULE_VEGA_INCBIN(joule_vega_embed_js, "vega-embed.min.js")
    ".popsection\n");

#undef JOULE_VEGA_INCBIN

#define JOULE_VEGA_DECLARE(sym)                                              \
  extern "C" __attribute__((visibility("hidden"))) const char sym##_start[]; \
  extern "C" __attribute__((visibility("hidden"))) const char sym##_end[];

JOULE_VEGA_DECLARE(joule_vega_js)
JOULE_VEGA_DECLARE(joule_vega_lite_js)
JOULE_VEGA_DECLARE(joule_vega_embed_js)

#undef JOULE_VEGA_DECLARE

namespace joule::assets {
namespace {

// The symbols are distinct objects to C++, so subtract addresses, not pointers.
std::string_view Span(const char* start, const char* end) {
  return {start, static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(end) -
                                          reinterpret_cast<std::uintptr_t>(start))};
}

}  // namespace

std::string_view VegaJs() { return Span(joule_vega_js_start, joule_vega_js_end); }
std::string_view VegaLiteJs() { return Span(joule_vega_lite_js_start, joule_vega_lite_js_end); }
std::string_view VegaEmbedJs() {
  return Span(joule_vega_embed_js_start, joule_vega_embed_js_end);
}

constexpr std::string_view kLicenceNotice =
    "Plots drawn by Vega " JOULE_VEGA_VERSION ", Vega-Lite " JOULE_VEGA_LITE_VERSION
    " and Vega-Embed " JOULE_VEGA_EMBED_VERSION
    " (https://vega.github.io), Copyright (c) 2015-2023 University of Washington Interactive "
    "Data Lab, each under the BSD-3-Clause licence.";
// It goes into an HTML comment or a JavaScript block comment.
static_assert(kLicenceNotice.find("--") == std::string_view::npos &&
              kLicenceNotice.find("*/") == std::string_view::npos &&
              kLicenceNotice.find('>') == std::string_view::npos);

std::string_view VegaLicenceNotice() { return kLicenceNotice; }

}  // namespace joule::assets
