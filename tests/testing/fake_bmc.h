#ifndef JOULE_TESTS_TESTING_FAKE_BMC_H_
#define JOULE_TESTS_TESTING_FAKE_BMC_H_

#include <httplib.h>

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace joule::testing {

// A BMC's Redfish service: each path's status and body, set by the test (thread-safe).
class FakeBmc {
 public:
  FakeBmc() {
    server_.Get(".*", [this](const httplib::Request& req, httplib::Response& res) {
      std::function<void()> delay;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++requests_;
        last_authorization_ = req.get_header_value("Authorization");
        if (!required_authorization_.empty() && last_authorization_ != required_authorization_) {
          res.status = 401;
          return;
        }
        auto it = routes_.find(req.path);
        if (it == routes_.end()) {
          res.status = 404;
          return;
        }
        res.status = it->second.first;
        res.set_content(it->second.second, "application/json");
        delay = stall_;
      }
      if (delay) delay();
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeBmc() {
    server_.stop();
    thread_.join();
  }
  void Serve(const std::string& path, const std::string& body, int status = 200) {
    std::lock_guard<std::mutex> lock(mu_);
    routes_[path] = {status, body};
  }
  void Remove(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    routes_.erase(path);
  }
  void RequireAuthorization(const std::string& header) {
    std::lock_guard<std::mutex> lock(mu_);
    required_authorization_ = header;
  }
  void Stall(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    stall_ = std::move(f);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, std::pair<int, std::string>> routes_;
  std::string required_authorization_, last_authorization_;
  std::function<void()> stall_;
  int requests_ = 0;
};

// A chassis collection of two chassis, "1U" first.
inline constexpr const char* kChassis = R"({"@odata.id": "/redfish/v1/Chassis",
  "Members": [{"@odata.id": "/redfish/v1/Chassis/1U"}, {"@odata.id": "/redfish/v1/Chassis/2"}],
  "Members@odata.count": 2})";

// Chassis/{id}/Power as DSP8010's Power.v1_7_1 has it (most BMCs today).
inline std::string PowerBody(const std::string& watts) {
  return R"({"@odata.type": "#Power.v1_7_1.Power", "Id": "Power",
    "PowerControl": [{"MemberId": "0", "Name": "System Power Control",
      "PowerConsumedWatts": )" +
         watts + R"(, "PowerCapacityWatts": 1600,
      "PowerMetrics": {"IntervalInMin": 1, "AverageConsumedWatts": 300}}]})";
}

// Chassis/{id}/EnvironmentMetrics as EnvironmentMetrics.v1_3_0 (Redfish 2020.4 and later).
inline std::string EnvironmentBody(const std::string& watts) {
  return R"({"@odata.type": "#EnvironmentMetrics.v1_3_0.EnvironmentMetrics",
    "PowerWatts": {"DataSourceUri": "/redfish/v1/Chassis/1U/Sensors/TotalPower",
                   "Reading": )" +
         watts + R"(}, "EnergykWh": {"Reading": 1234.5}})";
}

// A BMC serving chassis "1U" at `watts` on the deprecated Power resource, as most do.
inline void ServeChassisPower(FakeBmc& bmc, const std::string& watts) {
  bmc.Serve("/redfish/v1/Chassis", kChassis);
  bmc.Serve("/redfish/v1/Chassis/1U/Power", PowerBody(watts));
}

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_FAKE_BMC_H_
