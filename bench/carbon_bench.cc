// joule-bench-carbon: replays a day's hourly grid carbon intensity on a mix of jobs with
// deadlines, and compares starting each job at submit with Joule's carbon-aware plan
// (PlanGreenestStart, as the coordinator plans `joule submit --carbon-aware`), both under
// the same gang capacity and the coordinator's rule (due jobs FIFO by submit; a held job
// is not offered and blocks nothing). Reports the CO2 saved and the deadlines met.
//
// The profile: --profile FILE (any format joule-coordinator --carbon-intensity reads,
// repeated day after day to cover the deadlines), or by default a SYNTHETIC day (no
// published hourly profile was at hand in the stored documentation): a night plateau, a
// midday solar dip and an evening peak, 120-420 g/kWh. It is labelled synthetic in the
// output. The forecast the plans use is the profile times a seeded error of
// --forecast-error (relative, uniform); the CO2 is counted on the profile itself.
//
// --regions K: K sites of --capacity workers each, site i's profile the first one's
// shifted --region-shift hours later per site (a site further west: its solar dip comes
// later in UTC). At submit, a job takes its gang from the first site with room (as the
// scheduler, in worker order); a carbon-aware plan is made in every site and the greenest
// kept (least overbooked, then the lowest forecast mean: PlanCarbonAwareStartInRegions's
// rule), and the job runs there.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/carbon_intensity.h"

namespace {

constexpr int64_t kMinute = 60'000, kHour = 60 * kMinute, kDay = 24 * kHour;
constexpr int64_t kT0 = 1'800'000'000'000 / kDay * kDay;  // a UTC midnight

// The synthetic day, g/kWh by hour (UTC): see the file's comment.
std::vector<double> SyntheticDay() {
  std::vector<double> day(24);
  for (int h = 0; h < 24; ++h) {
    const double solar = h >= 7 && h <= 17 ? std::sin(M_PI * (h - 7) / 10.0) : 0;
    const double evening = std::exp(-std::pow((h - 19) / 2.0, 2));
    day[h] = 300 - 180 * solar + 120 * evening;
  }
  return day;
}

std::string Csv(const std::vector<double>& hourly, int days, double error, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> noise(-error, error);
  std::string csv = "time,gco2_per_kwh\n";
  for (int d = 0; d < days; ++d) {
    for (size_t h = 0; h < hourly.size(); ++h) {
      const double v = std::max(0.0, hourly[h] * (1 + (error > 0 ? noise(rng) : 0)));
      absl::StrAppend(&csv, (kT0 + d * kDay + static_cast<int64_t>(h) * kHour) / 1000, ",", v,
                      "\n");
    }
  }
  return csv;
}

struct Job {
  int64_t submit = 0, run = 0, finish_by = 0;
  int workers = 1;
  int64_t planned = 0;  // the plan's start (submit where not carbon-aware)
  int64_t latest = 0;   // the latest start that keeps the deadline (carbon-aware)
  int64_t started = -1;
  int region = -1;          // the site it is planned in (-1: any, the first with room)
  std::vector<int> ran_in;  // each rank's site
};

struct Outcome {
  // Per job (in the order given): its CO2, none where it never started within the replay
  // (3 days) or its run left the profile.
  std::vector<std::optional<double>> grams;
  int met = 0;
  int unstarted = 0;
};

// The CO2 of the jobs both runs started and covered (the only fair comparison).
std::pair<double, double> CommonGrams(const Outcome& a, const Outcome& b) {
  double ga = 0, gb = 0;
  for (size_t i = 0; i < a.grams.size() && i < b.grams.size(); ++i) {
    if (a.grams[i] && b.grams[i]) {
      ga += *a.grams[i];
      gb += *b.grams[i];
    }
  }
  return {ga, gb};
}

// Runs `jobs` (planned) on `capacity` workers per site in 5-minute ticks; CO2 at each
// site's `actual` profile.
Outcome Simulate(std::vector<Job> jobs, int capacity,
                 const std::vector<joule::IntensitySeries>& actual, double watts_per_worker) {
  Outcome out;
  std::vector<int> free(actual.size(), capacity);
  struct Running {
    int64_t end;
    int region, workers;
  };
  std::vector<Running> ending;
  const int64_t end = kT0 + 3 * kDay;
  const int sites = static_cast<int>(actual.size());
  for (int64_t t = kT0; t < end; t += 5 * kMinute) {
    for (auto it = ending.begin(); it != ending.end();) {
      if (it->end <= t) {
        free[it->region] += it->workers;
        it = ending.erase(it);
      } else {
        ++it;
      }
    }
    // The coordinator's order: jobs that waited and whose latest start has come first, then
    // the due in submit order; a job that cannot start holds back its site's workers (a
    // job of any site: every site's), no backfill past it.
    std::vector<Job*> queue;
    for (Job& j : jobs) {
      if (j.started < 0 && j.submit <= t && j.planned <= t) queue.push_back(&j);
    }
    std::stable_sort(queue.begin(), queue.end(), [t](const Job* a, const Job* b) {
      const auto boosted = [t](const Job* j) { return j->planned > j->submit && j->latest <= t; };
      return boosted(a) > boosted(b);
    });
    std::vector<bool> held(sites, false);
    bool all_held = false;
    for (Job* j : queue) {
      if (all_held) break;
      // Pinned to its site before its latest start, while the site can hold its gang;
      // then anywhere, its site first (the scheduler's preferred region).
      const bool pinned = j->region >= 0 && j->latest > t && capacity >= j->workers;
      std::vector<int> ranks;  // each rank's site
      const auto take = [&](int site, int n) {
        for (int k = 0; k < n; ++k) ranks.push_back(site);
      };
      if (pinned) {
        if (!held[j->region] && free[j->region] >= j->workers) take(j->region, j->workers);
      } else {
        std::vector<int> order;
        if (j->region >= 0) order.push_back(j->region);
        for (int r = 0; r < sites; ++r) {
          if (r != j->region) order.push_back(r);
        }
        for (int r : order) {  // one site that holds the gang
          if (ranks.empty() && !held[r] && free[r] >= j->workers) take(r, j->workers);
        }
        int spare = 0;
        for (int r = 0; r < sites; ++r) spare += held[r] ? 0 : free[r];
        if (ranks.empty() && spare >= j->workers) {  // else across sites, in site order
          for (int r = 0; r < sites && static_cast<int>(ranks.size()) < j->workers; ++r) {
            if (!held[r]) take(r, std::min(free[r], j->workers - static_cast<int>(ranks.size())));
          }
        }
      }
      if (ranks.empty()) {
        if (pinned) {
          held[j->region] = true;
        } else {
          all_held = true;
        }
        continue;
      }
      j->started = t;
      j->ran_in = ranks;
      for (int site : ranks) {
        --free[site];
        ending.push_back({t + j->run, site, 1});
      }
    }
  }
  for (const Job& j : jobs) {
    if (j.started < 0) {
      ++out.unstarted;
      out.grams.emplace_back();
      continue;
    }
    // Each rank's energy at its site's intensity.
    const double kwh_per_rank = watts_per_worker * (static_cast<double>(j.run) / 3.6e6) / 1000;
    std::optional<double> grams = 0.0;
    for (int site : j.ran_in) {
      const std::optional<double> mean = actual[site].Mean(j.started, j.started + j.run);
      grams = grams && mean ? std::optional<double>(*grams + kwh_per_rank * *mean) : std::nullopt;
    }
    out.grams.push_back(grams);
    if (j.started + j.run <= j.finish_by) ++out.met;
  }
  return out;
}

// The mix: submits spread over the day, runs of 15 min to 4 h on 1, 2 or 4 workers,
// deadlines 2 to 14 h of slack after the run; by submit time.
std::vector<Job> JobMix(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> submit(0, kDay - 1), run(15, 240), slack(120, 840);
  std::discrete_distribution<int> gang({6, 3, 1});
  std::vector<Job> jobs(n);
  for (Job& j : jobs) {
    j.submit = kT0 + submit(rng) / (5 * kMinute) * (5 * kMinute);
    j.run = run(rng) * kMinute;
    j.finish_by = j.submit + j.run + slack(rng) * kMinute;
    j.workers = 1 << gang(rng);
  }
  std::sort(jobs.begin(), jobs.end(),
            [](const Job& a, const Job& b) { return a.submit < b.submit; });
  return jobs;
}

// Plans each of `jobs` (by submit time) as `joule submit --carbon-aware --finish-by` and
// the coordinator do: the run's upper bound (the estimate + its interval; here 20%), in
// every site beside what the jobs planned before hold of its workers (`alone`: as if the
// cluster were the job's own), the greenest kept. Sets each job's planned start, latest
// start and site (-1 with one site); returns how many found no room before their deadline.
int PlanAcrossSites(std::vector<Job>& jobs, const std::vector<joule::IntensitySeries>& forecast,
                    int capacity, bool alone) {
  const int sites = static_cast<int>(forecast.size());
  std::vector<std::vector<joule::WorkerReservation>> reserved(sites);  // by site
  int crowded = 0;
  for (Job& j : jobs) {
    const int64_t upper = j.run * 6 / 5;
    j.latest = j.finish_by - upper;
    std::optional<joule::CarbonPlan> best;
    for (int site = 0; site < sites; ++site) {
      joule::CarbonPlanRequest r;
      r.now_ms = j.submit;
      r.latest_start_ms = j.latest;
      r.run_ms = upper;
      if (!alone) {
        r.capacity = capacity;
        r.workers = j.workers;
        r.reserved = reserved[site];
      }
      const joule::CarbonPlan plan = joule::PlanGreenestStart(forecast[site], r);
      const auto key = [](const joule::CarbonPlan& p) {
        return std::pair(p.crowded, p.planned_gco2_per_kwh.value_or(1e18));
      };
      if (!best || key(plan) < key(*best)) {
        best = plan;
        j.region = sites > 1 ? site : -1;
      }
    }
    j.planned = best->start_ms;
    crowded += best->crowded;
    reserved[std::max(0, j.region)].push_back({j.planned, j.planned + upper, j.workers});
  }
  return crowded;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"replay a day of grid carbon intensity on jobs with deadlines"};
  int jobs_n = 100, capacity = 16;
  uint64_t seed = 31;
  double error = 0.1, watts = 300;
  std::string profile;
  bool alone = false;
  int regions = 1;
  int region_shift = 6;
  app.add_option("--jobs", jobs_n, "jobs submitted over the day")->capture_default_str();
  app.add_option("--capacity", capacity, "workers in the cluster")->capture_default_str();
  app.add_option("--forecast-error", error, "relative forecast error (uniform, seeded)")
      ->capture_default_str();
  app.add_option("--watts", watts, "power per busy worker, W")->capture_default_str();
  app.add_flag("--alone", alone,
               "plan each job as if the cluster were its own (as before capacity-aware plans)");
  app.add_option("--regions", regions, "sites of --capacity workers each")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_option("--region-shift", region_shift,
                 "hours each further site's profile comes later than the one before")
      ->check(CLI::Range(0, 167))
      ->capture_default_str();
  app.add_option("--seed", seed, "the job mix's and forecast error's seed")->capture_default_str();
  app.add_option("--profile", profile,
                 "a day (or more) of intensity in a --carbon-intensity format; default: the "
                 "synthetic day");
  CLI11_PARSE(app, argc, argv);

  std::vector<double> hourly = SyntheticDay();
  std::string label = "SYNTHETIC day (night plateau, solar dip, evening peak)";
  if (!profile.empty()) {
    std::ifstream in(profile);
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<joule::IntensitySeries> read = joule::IntensitySeries::Parse(text.str());
    if (!in || !read.ok()) {
      std::cerr << "error: --profile " << profile << ": "
                << (read.ok() ? "cannot be read" : std::string(read.status().message())) << "\n";
      return 2;
    }
    hourly.clear();
    for (int64_t t = read->begin_ms(); t < read->end_ms() && hourly.size() < 24 * 7; t += kHour) {
      hourly.push_back(read->Mean(t, t + kHour).value_or(read->At(t).value_or(0)));
    }
    label = absl::StrCat(profile, " (", read->format(), "), hour by hour, repeated");
  }
  const int days = 3 + static_cast<int>(24 / std::max<size_t>(1, hourly.size()));
  std::vector<double> tiled;
  while (tiled.size() < static_cast<size_t>(days) * 24) {
    tiled.insert(tiled.end(), hourly.begin(), hourly.end());
  }
  tiled.resize(static_cast<size_t>(days) * 24);
  // Site r: the profile `r x shift` hours later (wrapping by the profile's own period).
  std::vector<joule::IntensitySeries> actual, forecast;
  for (int r = 0; r < regions; ++r) {
    std::vector<double> site(tiled.size());
    const size_t period = hourly.size();
    const size_t shift = static_cast<size_t>(r * region_shift) % period;
    for (size_t h = 0; h < tiled.size(); ++h)
      site[h] = hourly[(h % period + period - shift) % period];
    actual.push_back(*joule::IntensitySeries::Parse(Csv(site, 1, 0, seed)));
    forecast.push_back(*joule::IntensitySeries::Parse(Csv(site, 1, error, seed + 1 + r)));
  }

  std::vector<Job> jobs = JobMix(jobs_n, seed);
  std::vector<Job> now = jobs, planned = jobs;
  for (Job& j : now) {
    j.planned = j.submit;
    j.latest = std::numeric_limits<int64_t>::max();  // not carbon-aware: FIFO only
  }
  const int crowded = PlanAcrossSites(planned, forecast, capacity, alone);
  double worker_ms = 0;
  for (const Job& j : jobs) worker_ms += static_cast<double>(j.run) * j.workers;
  const double load = worker_ms / (static_cast<double>(capacity) * regions * kDay);
  const Outcome base = Simulate(now, capacity, actual, watts);
  const Outcome aware = Simulate(planned, capacity, actual, watts);
  const auto [base_grams, aware_grams] = CommonGrams(base, aware);
  std::cout << absl::StrFormat(
      "joule-bench-carbon: %d jobs over a day on %d workers at %.0f W each (the jobs' "
      "worker-hours are %.0f%% of the cluster's day)\n"
      "  profile: %s%s\n"
      "  forecast: the profile with a %.0f%% uniform error (seed %d)\n"
      "  plans: %s (%d found no room before their deadline: planned where the fewest workers "
      "are overbooked)\n"
      "  (CO2 of the jobs both runs started)\n"
      "  start at submit:   %10.1f g CO2, deadlines met %d/%d, never started %d\n"
      "  carbon-aware:      %10.1f g CO2, deadlines met %d/%d, never started %d\n"
      "  saved:             %10.1f%%\n",
      jobs_n, capacity * regions, watts, 100 * load, label,
      regions > 1 ? absl::StrFormat("; %d sites of %d workers, each %d h later than the one "
                                    "before",
                                    regions, capacity, region_shift)
                  : std::string(),
      100 * error, seed,
      alone ? "each job alone (--alone)" : "beside the workers the plans before hold", crowded,
      base_grams, base.met, jobs_n, base.unstarted, aware_grams, aware.met, jobs_n, aware.unstarted,
      base_grams > 0 ? 100 * (1 - aware_grams / base_grams) : 0.0);
  return 0;
}
