#ifndef JOULE_COMMON_FIT_H_
#define JOULE_COMMON_FIT_H_

// Least-squares fits with their 95% confidence intervals, for sweeps (energy against
// device-hours, Huber et al.) and estimates (time and energy from a job family's history).
// Pure functions; thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace joule {

// A least-squares line y = slope x + intercept with 95% confidence intervals (Student t
// with n - 2 degrees of freedom; t quantiles from the standard table, e.g. NIST/SEMATECH
// e-Handbook 1.3.6.7.2, interpolated in 1/df). r2 is the coefficient of determination.
struct LineFit {
  int n = 0;
  double slope = 0, intercept = 0, r2 = 0;
  double slope_ci95 = 0, intercept_ci95 = 0;  // half-widths; 0 when n < 3
};
// Errors: FAILED_PRECONDITION with fewer than 2 points or all x equal.
absl::StatusOr<LineFit> FitLine(const std::vector<double>& x, const std::vector<double>& y);
// The energy fit as one line of text, as the CLI and the HTML report print it: "S +- D J per
// device-hour, intercept I +- E J, R^2 R (n=N, 95% intervals)"; with too few points for an
// interval (n < 3: a line through two points fits them exactly, R^2 says nothing) it says
// so in words instead of printing +- 0 and R^2 1.
std::string LineFitText(const LineFit& fit);
// Ordinary least squares y = b[0] + b[1] x1 + ... + b[k] xk for k = columns.size() (1..4)
// regressors, each column as long as y, with 95% confidence half-widths (Student t with
// n - k - 1 degrees of freedom; 0 when n <= k + 1) and R^2. Solved from the normal
// equations, equilibrated to a unit diagonal (Gauss-Jordan with partial pivoting; k is
// tiny). Errors: FAILED_PRECONDITION with n < k + 1 points, an all-zero regressor or
// collinear regressors (a pivot below 1e-12 of the equilibrated matrix).
struct LinearFit {
  int n = 0;
  std::vector<double> coefficients;  // intercept first
  std::vector<double> ci95;
  double r2 = 0;
};
absl::StatusOr<LinearFit> FitLinear(const std::vector<std::vector<double>>& columns,
                                    const std::vector<double>& y);
// The fit's terms as text, `names[i]` naming regressor i ("x samples/device-hour"), with
// their 95% half-widths and R^2, or, with no degree of freedom left (n <= k + 1), what the
// line could not say ("n=3 for 3 coefficients: an exact fit, no interval or R^2").
std::string LinearFitText(const LinearFit& fit, const std::vector<std::string>& names);
// The two-sided 95% quantile of Student's t with `df` >= 1 degrees of freedom.
double StudentT975(int df);

}  // namespace joule

#endif  // JOULE_COMMON_FIT_H_
