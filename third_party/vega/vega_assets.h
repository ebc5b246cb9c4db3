// The vendored Vega 6, Vega-Lite 6 and Vega-Embed 7 minified browser builds
// (third_party/vega/*.min.js, see README.md there), embedded in the program.
//
// Each view is exactly the bytes of its file (UTF-8 JavaScript, no terminating NUL counted),
// valid for the life of the program. In HTML, inline them in this order, each in its own
// <script> element, in a page declared <meta charset="utf-8">: vega, vega-lite, vega-embed
// (the UMD builds of vega-lite and vega-embed read the globals `vega` and `vegaLite`).
// Together they need nothing else: no network, no other script.
#pragma once

#include <string_view>

namespace joule::assets {

std::string_view VegaJs();       // vega.min.js (defines the global `vega`)
std::string_view VegaLiteJs();   // vega-lite.min.js (defines `vegaLite`)
std::string_view VegaEmbedJs();  // vega-embed.min.js (defines `vegaEmbed`)

// One line naming the three libraries, their versions and their licence (BSD-3-Clause), to
// put in a comment of generated HTML. Contains no "--", ">" or "*/".
std::string_view VegaLicenceNotice();

}  // namespace joule::assets
