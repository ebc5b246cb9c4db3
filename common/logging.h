#ifndef JOULE_COMMON_LOGGING_H_
#define JOULE_COMMON_LOGGING_H_

#include <string>

namespace joule {

// Sets up spdlog's default logger for a program: stderr, with the program name, pid and
// thread in every line. `level` is one of trace, debug, info, warn, error (else info).
void InitLogging(const std::string& program, const std::string& level);

}  // namespace joule

#endif  // JOULE_COMMON_LOGGING_H_
