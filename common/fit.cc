#include "common/fit.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace joule {

double StudentT975(int df) {
  // Two-sided 95% (0.975 quantile) of Student's t: NIST/SEMATECH e-Handbook of Statistical
  // Methods, table 1.3.6.7.2; between the tabulated df, linear in 1/df (exact to 3 digits).
  static constexpr struct {
    int df;
    double t;
  } kTable[] = {{1, 12.706}, {2, 4.303},  {3, 3.182},  {4, 2.776},  {5, 2.571},
                {6, 2.447},  {7, 2.365},  {8, 2.306},  {9, 2.262},  {10, 2.228},
                {11, 2.201}, {12, 2.179}, {13, 2.160}, {14, 2.145}, {15, 2.131},
                {16, 2.120}, {17, 2.110}, {18, 2.101}, {19, 2.093}, {20, 2.086},
                {25, 2.060}, {30, 2.042}, {40, 2.021}, {60, 2.000}, {120, 1.980}};
  if (df <= 1) return kTable[0].t;
  for (size_t i = 1; i < std::size(kTable); ++i) {
    if (df <= kTable[i].df) {
      const double a = 1.0 / kTable[i - 1].df, b = 1.0 / kTable[i].df, x = 1.0 / df;
      return kTable[i - 1].t + (kTable[i].t - kTable[i - 1].t) * (a - x) / (a - b);
    }
  }
  const double x = 1.0 / df, a = 1.0 / 120;  // toward 1.960 at df = infinity
  return 1.960 + (1.980 - 1.960) * x / a;
}

absl::StatusOr<LineFit> FitLine(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = std::min(x.size(), y.size());
  if (n < 2) return absl::FailedPreconditionError("a line needs at least 2 points");
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= n;
  my /= n;
  double sxx = 0, sxy = 0, syy = 0, xx = 0;
  for (size_t i = 0; i < n; ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
    syy += (y[i] - my) * (y[i] - my);
    xx += x[i] * x[i];
  }
  // Relative: x spread below rounding of the x themselves is no spread.
  if (sxx <= 1e-12 * xx || sxx <= 0) {
    return absl::FailedPreconditionError("every x is the same: no slope to fit");
  }
  LineFit f;
  f.n = static_cast<int>(n);
  f.slope = sxy / sxx;
  f.intercept = my - f.slope * mx;
  double sse = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = y[i] - (f.slope * x[i] + f.intercept);
    sse += r * r;
  }
  f.r2 = syy > 0 ? 1 - sse / syy : 1;
  if (n >= 3) {
    const double s2 = sse / static_cast<double>(n - 2);
    const double t = StudentT975(static_cast<int>(n - 2));
    f.slope_ci95 = t * std::sqrt(s2 / sxx);
    f.intercept_ci95 = t * std::sqrt(s2 * (1.0 / n + mx * mx / sxx));
  }
  return f;
}

absl::StatusOr<LinearFit> FitLinear(const std::vector<std::vector<double>>& columns,
                                    const std::vector<double>& y) {
  const size_t k = columns.size(), p = k + 1, n = y.size();
  if (k < 1 || k > 4) return absl::InvalidArgumentError("1 to 4 regressors");
  for (const auto& c : columns) {
    if (c.size() != n) return absl::InvalidArgumentError("every column as long as y");
  }
  if (n < p) {
    return absl::FailedPreconditionError(
        absl::StrCat(p, " coefficients need at least ", p, " points, not ", n));
  }
  auto x = [&](size_t row, size_t col) { return col == 0 ? 1.0 : columns[col - 1][row]; };
  // [X'X | I] -> [I | (X'X)^-1] by Gauss-Jordan; beta = (X'X)^-1 X'y.
  std::vector<std::vector<double>> a(p, std::vector<double>(2 * p, 0.0));
  for (size_t i = 0; i < p; ++i) {
    for (size_t j = 0; j < p; ++j) {
      for (size_t r = 0; r < n; ++r) a[i][j] += x(r, i) * x(r, j);
    }
    a[i][p + i] = 1;
  }
  // Equilibrate (D^-1/2 X'X D^-1/2, unit diagonal) so that regressors of very different
  // magnitudes (1e8 samples per device-hour next to an intercept) keep their precision
  // and the collinearity test below is relative; undone on the inverse afterwards.
  std::vector<double> scale(p);
  for (size_t i = 0; i < p; ++i) {
    if (a[i][i] <= 0) return absl::FailedPreconditionError("a regressor is all zeros");
    scale[i] = 1 / std::sqrt(a[i][i]);
  }
  for (size_t i = 0; i < p; ++i) {
    for (size_t j = 0; j < p; ++j) a[i][j] *= scale[i] * scale[j];
  }
  constexpr double kCollinear = 1e-12;  // a pivot this small, on the unit diagonal
  for (size_t c = 0; c < p; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < p; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (std::abs(a[pivot][c]) <= kCollinear) {
      return absl::FailedPreconditionError("the regressors are collinear: no unique fit");
    }
    std::swap(a[c], a[pivot]);
    const double d = a[c][c];
    for (double& v : a[c]) v /= d;
    for (size_t r = 0; r < p; ++r) {
      if (r == c || a[r][c] == 0) continue;
      const double m = a[r][c];
      for (size_t j = 0; j < 2 * p; ++j) a[r][j] -= m * a[c][j];
    }
  }
  for (size_t i = 0; i < p; ++i) {
    for (size_t j = 0; j < p; ++j) a[i][p + j] *= scale[i] * scale[j];  // (X'X)^-1
  }
  LinearFit f;
  f.n = static_cast<int>(n);
  f.coefficients.assign(p, 0.0);
  for (size_t i = 0; i < p; ++i) {
    for (size_t j = 0; j < p; ++j) {
      double xty = 0;
      for (size_t r = 0; r < n; ++r) xty += x(r, j) * y[r];
      f.coefficients[i] += a[i][p + j] * xty;
    }
  }
  double mean = 0;
  for (double v : y) mean += v;
  mean /= static_cast<double>(n);
  double sse = 0, sst = 0;
  for (size_t r = 0; r < n; ++r) {
    double fitted = 0;
    for (size_t i = 0; i < p; ++i) fitted += f.coefficients[i] * x(r, i);
    sse += (y[r] - fitted) * (y[r] - fitted);
    sst += (y[r] - mean) * (y[r] - mean);
  }
  f.r2 = sst > 0 ? 1 - sse / sst : 1;
  f.ci95.assign(p, 0.0);
  if (n > p) {
    const double s2 = sse / static_cast<double>(n - p);
    const double t = StudentT975(static_cast<int>(n - p));
    for (size_t i = 0; i < p; ++i) f.ci95[i] = t * std::sqrt(std::max(0.0, s2 * a[i][p + i]));
  }
  return f;
}

std::string LineFitText(const LineFit& fit) {
  if (fit.n < 3) {
    return absl::StrFormat(
        "%.1f J per device-hour, intercept %.2f J (n=%d: a line through %d points fits them "
        "exactly; too few points for an interval or R^2)",
        fit.slope, fit.intercept, fit.n, fit.n);
  }
  return absl::StrFormat(
      "%.1f +- %.1f J per device-hour, intercept %.2f +- %.2f J, R^2 %.4f (n=%d, 95%% "
      "intervals)",
      fit.slope, fit.slope_ci95, fit.intercept, fit.intercept_ci95, fit.r2, fit.n);
}

std::string LinearFitText(const LinearFit& fit, const std::vector<std::string>& names) {
  const size_t p = fit.coefficients.size();
  const bool intervals = static_cast<size_t>(fit.n) > p;
  std::string out;
  for (size_t i = 0; i < p; ++i) {
    const std::string term =
        intervals ? absl::StrFormat("%.4g (+- %.2g)", fit.coefficients[i], fit.ci95[i])
                  : absl::StrFormat("%.4g", fit.coefficients[i]);
    absl::StrAppend(&out, i == 0 ? "" : " + ", term,
                    i > 0 && i - 1 < names.size() ? " " + names[i - 1] : "");
  }
  if (intervals) {
    absl::StrAppend(&out, absl::StrFormat(", R^2 %.4f (n=%d, 95%% intervals)", fit.r2, fit.n));
  } else {
    absl::StrAppend(&out, absl::StrFormat(" (n=%d for %d coefficients: an exact fit; too few "
                                          "points for an interval or R^2)",
                                          fit.n, p));
  }
  return out;
}

}  // namespace joule
