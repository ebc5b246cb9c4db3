#include "worker/blas/kernel_choice.h"

#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace joule::worker {

int CoreIsaLevel(const std::string& core) {
  static constexpr std::pair<std::string_view, int> kLevels[] = {
      {"katmai", 0},       {"coppermine", 0},    {"northwood", 0},  {"prescott", 0},
      {"banias", 0},       {"atom", 0},          {"core2", 0},      {"penryn", 0},
      {"dunnington", 0},   {"nehalem", 0},       {"athlon", 0},     {"opteron", 0},
      {"opteron_sse3", 0}, {"barcelona", 0},     {"nano", 0},       {"bobcat", 0},
      {"sandybridge", 1},  {"bulldozer", 1},     {"piledriver", 1}, {"steamroller", 1},
      {"haswell", 2},      {"zen", 2},           {"excavator", 2},  {"skylakex", 3},
      {"cooperlake", 3},   {"sapphirerapids", 3}};
  const std::string lower = absl::AsciiStrToLower(core);
  for (const auto& [name, level] : kLevels) {
    if (name == lower) return level;
  }
  return -1;
}

KernelDecision ChooseKernel(const std::string& mode, const std::string& current_core,
                            const CpuFeatures& cpu, const std::string& user_coretype) {
  KernelDecision d;
  const std::string current(current_core);
  if (current.empty()) {
    d.reason = "the BLAS is not OpenBLAS: its kernel is its own choice";
    return d;
  }
  if (!user_coretype.empty()) {
    d.reason =
        absl::StrCat("OPENBLAS_CORETYPE=", user_coretype, " set by the user: ", current, " kept");
    return d;
  }
  static constexpr const char* kIsa[] = {"SSE", "AVX", "AVX2", "AVX-512"};
  if (absl::EqualsIgnoreCase(mode, "keep")) {
    d.reason = absl::StrCat("--blas-kernel keep: OpenBLAS's own choice, ", current);
    return d;
  }
  if (!absl::EqualsIgnoreCase(mode, "auto")) {
    if (absl::EqualsIgnoreCase(mode, current)) {
      d.reason = absl::StrCat("--blas-kernel ", mode, ": OpenBLAS chose it already");
      return d;
    }
    // OpenBLAS runs a forced core without asking the CPU: one it cannot run would die of
    // SIGILL in the check, at every start. Only cores this table knows, and the CPU runs.
    const int needs = CoreIsaLevel(mode);
    if (needs < 0) {
      d.reason = absl::StrCat("--blas-kernel ", mode,
                              " is not an x86 OpenBLAS core this worker "
                              "knows: OpenBLAS's own choice, ",
                              current, ", kept");
      return d;
    }
    if (needs > cpu.IsaLevel()) {
      d.reason = absl::StrCat("--blas-kernel ", mode, " needs ", kIsa[needs], ", which this CPU ",
                              "lacks: OpenBLAS's own choice, ", current, ", kept");
      return d;
    }
    d.switch_core = true;
    d.core = absl::AsciiStrToUpper(mode);
    d.reason = absl::StrCat("--blas-kernel ", mode, " (OpenBLAS chose ", current, ")");
    return d;
  }
  const int have = CoreIsaLevel(current), can = cpu.IsaLevel();
  if (have < 0) {
    d.reason = absl::StrCat(current, " is a core this worker does not rank: kept");
    return d;
  }
  if (have >= can) {
    d.reason = absl::StrCat(current, " uses the widest vectors this CPU has");
    return d;
  }
  const bool amd = cpu.vendor == "AuthenticAMD" || cpu.vendor == "HygonGenuine";
  d.switch_core = true;
  d.core = can == 3 ? "SKYLAKEX" : can == 2 ? (amd ? "ZEN" : "HASWELL") : "SANDYBRIDGE";
  d.reason =
      absl::StrCat("OpenBLAS chose ", current, " (", kIsa[have], ") on a CPU with ", kIsa[can],
                   " (", cpu.model_name.empty() ? "unnamed" : cpu.model_name, ", family ",
                   cpu.family, " model ", cpu.model, "); switching to ", d.core);
  return d;
}

}  // namespace joule::worker
