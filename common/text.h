#ifndef JOULE_COMMON_TEXT_H_
#define JOULE_COMMON_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace joule {

// Text that crosses a process boundary in a protobuf `string` field must be valid UTF-8
// (proto3 refuses to parse anything else, and a peer that cannot parse a message drops
// the stream). These helpers make user data safe to quote in messages and bound its size.
// All are pure functions; thread-safe.

// The byte offset of the first invalid UTF-8 sequence in `s` (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or npos when `s` is valid.
size_t FirstInvalidUtf8(std::string_view s);
inline bool IsValidUtf8(std::string_view s) { return FirstInvalidUtf8(s) == std::string_view::npos; }

// `s` as valid UTF-8 of at most `max_bytes` bytes, for quoting user data in an error
// message or a log line: each byte of an invalid sequence and each ASCII control
// character (tab included, newline included: messages are one line) becomes "\xNN", a
// backslash "\\", and characters that break lines or reorder text invisibly (C1
// controls, U+2028/U+2029, bidirectional overrides and isolates) "\uNNNN". A result past
// `max_bytes` is cut on a character boundary and ends in "..."; one that fits is
// returned whole. Never cuts a character or an escape in half. `max_bytes` below 3 is
// taken as 3.
std::string SanitizeUtf8(std::string_view s, size_t max_bytes = 1024);

// OK when `value` is valid UTF-8 without control characters (ASCII and C1 controls, line
// and paragraph separators, bidirectional overrides: see SanitizeUtf8) and at most
// `max_bytes` bytes. Errors: INVALID_ARGUMENT naming `field`, e.g. "labels[\"team\"] is not valid
// UTF-8 at byte 3", "name is 300 bytes, more than 256", "host holds a control
// character at byte 7".
absl::Status CheckText(std::string_view field, std::string_view value, size_t max_bytes);

// An amount of energy in joules from "50000", "50kJ", "50 kJ", "1.5MJ", "2GJ", "12Wh",
// "0.5kWh", "1MWh" (SI prefixes k, M, G on J and Wh; 1 Wh = 3600 J; no unit = joules).
// INVALID_ARGUMENT, naming the text, for anything else, a negative, NaN or infinite value;
// OUT_OF_RANGE for a number beyond a double ("1e400kJ") or a non-zero one too small for
// one ("1e-400J", which would read as 0).
absl::StatusOr<double> ParseEnergy(std::string_view text);

// An energy budget: ParseEnergy's amounts, above 0, or "none" (no budget: returns 0).
// INVALID_ARGUMENT for 0 ("0J" would otherwise silently mean no budget) and as
// ParseEnergy; OUT_OF_RANGE as ParseEnergy.
absl::StatusOr<double> ParseEnergyBudget(std::string_view text);

// The candidate closest to `word` by edit distance (Levenshtein, with a swap of adjacent
// letters counting 1, case-insensitive) when it is close enough to be a typo: at most
// max(1, length / 3) edits, and not `word` itself. Empty otherwise. For "did you mean".
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);

// One CSV field (RFC 4180): quoted when it holds a comma, a quote, CR or LF (its quotes
// doubled), else as it is; a field that starts with =, +, -, @, a tab or CR gets a leading
// ' so a spreadsheet does not run it as a formula (OWASP's CSV injection advice), but a
// plain signed number ("-5.5").
std::string CsvField(std::string_view field);

}  // namespace joule

#endif  // JOULE_COMMON_TEXT_H_
