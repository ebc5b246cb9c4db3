#ifndef JOULE_COMMON_SWEEP_FORMAT_H_
#define JOULE_COMMON_SWEEP_FORMAT_H_

// A sweep's rows as the CLI prints them: an aligned table, CSV and JSON. Pure;
// thread-safe.

#include <string>
#include <utility>
#include <vector>

#include "common/fit.h"
#include "common/sweep_summary.h"

namespace joule {

// Renders rows as an aligned text table, CSV (a header, then one line a row) or JSON (an
// array of objects; numbers as numbers).
std::string SweepTable(const std::vector<SweepRow>& rows);
// The CSV: a row a cell, the summary's columns, then a column per grid axis
// ("grid.FIELD", the cell's value of it; empty where a cell has none).
std::string SweepCsv(const std::vector<SweepRow>& rows);
// A cell key's axes ("workers=2,hidden=[512, 256]") as (field, value) pairs, in order.
std::vector<std::pair<std::string, std::string>> GridAxes(const std::string& key);
// `slope_model`: the regression of energy per device-hour on samples and updates per
// device-hour (may be null, as `fit`).
std::string SweepJson(const std::vector<SweepRow>& rows, const LineFit* fit,
                      const LinearFit* slope_model = nullptr);

}  // namespace joule

#endif  // JOULE_COMMON_SWEEP_FORMAT_H_
