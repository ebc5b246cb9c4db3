#include "common/text.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
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

// The code point of one valid UTF-8 sequence.
uint32_t CodePoint(std::string_view c) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(c[k])); };
  switch (c.size()) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) |
                    (b(3) & 0x3F);
  }
}

// Characters that break a line or reorder what follows without showing: C1 controls
// (U+0080..U+009F, NEL among them), the line and paragraph separators (U+2028, U+2029)
// and the bidirectional embeddings, overrides and isolates (U+202A..U+202E,
// U+2066..U+2069; the "Trojan Source" characters, CVE-2021-42574).
bool IsInvisibleBreak(std::string_view c) {
  if (c.size() < 2) return false;
  const uint32_t cp = CodePoint(c);
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 ||
         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

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
  // The pieces of the escaped text, each a whole character or a whole escape; cut after
  // the last piece that leaves room for "..." when the whole does not fit.
  std::string out;
  size_t fits_with_dots = 0;  // length of the longest prefix that leaves room for "..."
  bool cut = false;
  for (size_t i = 0; i < s.size();) {
    const size_t n = SequenceLength(s, i);
    std::string piece;
    if (n == 0 || (n == 1 && IsControl(static_cast<unsigned char>(s[i])))) {
      piece = absl::StrFormat("\\x%02X", static_cast<unsigned char>(s[i]));
      i += 1;
    } else if (n == 1 && s[i] == '\\') {
      piece = "\\\\";  // so that "\\x41" in the text cannot pass for an escape
      i += 1;
    } else if (IsInvisibleBreak(s.substr(i, n))) {
      piece = absl::StrFormat("\\u%04X", CodePoint(s.substr(i, n)));
      i += n;
    } else {
      piece.assign(s.substr(i, n));
      i += n;
    }
    if (out.size() + piece.size() + 3 <= max_bytes) fits_with_dots = out.size() + piece.size();
    out += piece;
    if (out.size() > max_bytes) {
      cut = true;
      break;
    }
  }
  if (!cut) return out;
  out.resize(fits_with_dots);
  out += "...";
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
  for (size_t i = 0; i < value.size();) {
    const size_t n = SequenceLength(value, i);
    if ((n == 1 && IsControl(static_cast<unsigned char>(value[i]))) ||
        IsInvisibleBreak(value.substr(i, n))) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(field), " holds a control character at byte ", i));
    }
    i += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<double> ParseEnergy(std::string_view text) {
  auto strip = [](std::string_view v) {
    const absl::string_view a = absl::StripAsciiWhitespace(absl::string_view(v.data(), v.size()));
    return std::string_view(a.data(), a.size());
  };
  const std::string_view t = strip(text);
  size_t unit_at = t.size();
  while (unit_at > 0 && absl::ascii_isalpha(static_cast<unsigned char>(t[unit_at - 1]))) --unit_at;
  const std::string_view number = strip(t.substr(0, unit_at));
  const std::string_view unit = t.substr(unit_at);
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1},      {"J", 1},      {"kJ", 1e3},          {"MJ", 1e6},         {"GJ", 1e9},
      {"Wh", 3600}, {"kWh", 3.6e6}, {"MWh", 3.6e9}};
  double scale = 0;
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) scale = factor;
  }
  // Decimal only (SimpleAtod would also take hexadecimal, "inf" and "nan").
  const bool decimal = number.find_first_not_of("0123456789.eE+-") == std::string_view::npos &&
                       text.find_first_of("\t\n\v\f\r") == std::string_view::npos;
  double value = 0;
  const std::string digits(number);
  const bool parsed = scale != 0 && !digits.empty() && decimal &&
                      absl::SimpleAtod(digits, &value) && !std::isnan(value) && value >= 0;
  if (!parsed && scale != 0 && decimal && !digits.empty() && digits[0] != '-') {
    // A decimal number strtod reads but a double cannot hold (SimpleAtod refuses or gives
    // infinity; std::strtod says ERANGE).
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(digits.c_str(), &end);
    if (end == digits.c_str() + digits.size() && (errno == ERANGE || std::isinf(v))) {
      return absl::OutOfRangeError(absl::StrCat(
          "energy \"", SanitizeUtf8(text, 64), "\" is out of range: ",
          std::isinf(v) || v > 1 ? "too large for a double" : "too small to tell from 0"));
    }
  }
  if (!parsed || !std::isfinite(value)) {
    if (parsed && std::isinf(value)) {
      return absl::OutOfRangeError(absl::StrCat("energy \"", SanitizeUtf8(text, 64),
                                                "\" is out of range: too large for a double"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "energy \"", SanitizeUtf8(text, 64),
        "\" is not a non-negative amount in J, kJ, MJ, GJ, Wh, kWh or MWh (e.g. 50kJ)"));
  }
  // A non-zero mantissa that read as 0 underflowed ("1e-400").
  const std::string mantissa = digits.substr(0, digits.find_first_of("eE"));
  if (value == 0 && mantissa.find_first_of("123456789") != std::string::npos) {
    return absl::OutOfRangeError(absl::StrCat("energy \"", SanitizeUtf8(text, 64),
                                              "\" is out of range: too small to tell from 0"));
  }
  if (!std::isfinite(value * scale)) {
    return absl::OutOfRangeError(absl::StrCat("energy \"", SanitizeUtf8(text, 64),
                                              "\" is out of range: too large for a double"));
  }
  return value * scale;
}

absl::StatusOr<double> ParseEnergyBudget(std::string_view text) {
  if (absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())) == "none") {
    return 0.0;
  }
  absl::StatusOr<double> joules = ParseEnergy(text);
  if (!joules.ok()) return joules.status();
  if (*joules <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "energy budget \"", SanitizeUtf8(text, 64),
        "\" is 0: a budget must be above 0 (\"none\" for no budget)"));
  }
  return *joules;
}

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string w = absl::AsciiStrToLower(absl::string_view(word.data(), word.size()));
  // Optimal string alignment distance (adjacent transpositions count 1).
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    return d[a.size()][b.size()];
  };
  if (w.empty() || w.size() > 256) return "";
  std::string best;
  size_t best_distance = std::max<size_t>(1, w.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const std::string lc = absl::AsciiStrToLower(c);
    if (lc == w || lc.size() > 256) continue;
    const size_t dist = distance(w, lc);
    if (dist < best_distance) {
      best_distance = dist;
      best = c;
    }
  }
  return best;
}

std::string CsvField(std::string_view field) {
  std::string out(field);
  if (!out.empty() && std::string_view("=+-@\t\r").find(out[0]) != std::string_view::npos) {
    // A plain number keeps its sign ("-5.5"); "-1+2" is a formula.
    double number = 0;
    const bool plain = (out[0] == '-' || out[0] == '+') && out.size() > 1 &&
                       std::isdigit(static_cast<unsigned char>(out[1])) &&
                       out.find_first_of("+-", 1) == std::string::npos &&
                       absl::SimpleAtod(out, &number);
    if (!plain) out.insert(0, "'");
  }
  if (out.find_first_of(",\"\r\n") == std::string::npos) return out;
  std::string quoted = "\"";
  for (char c : out) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace joule
