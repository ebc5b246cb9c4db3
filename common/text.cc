#include "common/text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace joule {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid.
size_t SequenceLength(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (RFC 3629 table)
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // no overlong forms
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  return n;
}

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7F; }

}  // namespace

size_t FirstInvalidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = SequenceLength(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string SanitizeUtf8(std::string_view s, size_t max_bytes) {
  if (max_bytes < 3) max_bytes = 3;
  std::string out;
  out.reserve(std::min(s.size(), max_bytes));
  for (size_t i = 0; i < s.size();) {
    const size_t n = SequenceLength(s, i);
    std::string piece;
    if (n == 0 || (n == 1 && IsControl(static_cast<unsigned char>(s[i])))) {
      piece = absl::StrFormat("\\x%02X", static_cast<unsigned char>(s[i]));
      i += 1;
    } else {
      piece.assign(s.substr(i, n));
      i += n;
    }
    // Keep room for "..." unless this piece ends the string.
    const size_t room = i == s.size() ? max_bytes : max_bytes - 3;
    if (out.size() + piece.size() > room) {
      // Trim so that "..." fits, on a boundary of what was already appended (whole
      // characters and whole escapes only).
      while (out.size() + 3 > max_bytes && !out.empty()) {
        size_t cut = out.size() - 1;
        while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
        // An escape "\xNN" is four ASCII bytes: drop it whole.
        if (cut >= 3 && out.compare(cut - 3, 2, "\\x") == 0) cut -= 3;
        out.resize(cut);
      }
      out += "...";
      return out;
    }
    out += piece;
  }
  return out;
}

absl::Status CheckText(std::string_view field, std::string_view value, size_t max_bytes) {
  if (value.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " is ", value.size(), " bytes, more than ", max_bytes));
  }
  if (size_t bad = FirstInvalidUtf8(value); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " is not valid UTF-8 at byte ", bad));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    if (IsControl(static_cast<unsigned char>(value[i]))) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(field), " holds a control character at byte ", i));
    }
  }
  return absl::OkStatus();
}

}  // namespace joule
