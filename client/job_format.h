#ifndef JOULE_CLIENT_JOB_FORMAT_H_
#define JOULE_CLIENT_JOB_FORMAT_H_

// A job as `joule list`, `status` and `watch` print it for people (`-o json` prints every
// field instead: common/json_output.h). Pure functions; thread-safe.

#include <string>

#include "joule/v1/job.pb.h"

namespace joule::client {

// One line per job, in columns under JobListHeader().
std::string JobLine(const v1::Job& job);
std::string JobListHeader();
// `joule list -o csv`: the same jobs, a row each, numbers unformatted (energy in J, times
// RFC 3339 UTC, duration in seconds), fields quoted as CSV wants (CsvField).
std::string JobCsvHeader();
std::string JobCsvLine(const v1::Job& job);
// The multi-line view of `joule status`: the spec, the attempts, the progress or the end.
std::string JobDetails(const v1::Job& job);
// "about 42 s left" for a running job (its steps so far against its total, at the
// attempt's pace), or "" when it cannot tell.
std::string TimeLeft(const v1::Job& job);

// "OpenBLAS Cooperlake x2": a worker's BLAS library, kernel and threads, " (fallback)"
// added for a kernel narrower than its CPU's vectors; "-" when unknown (an older worker).
std::string BlasLabel(const v1::BlasInfo& blas);

}  // namespace joule::client

#endif  // JOULE_CLIENT_JOB_FORMAT_H_
