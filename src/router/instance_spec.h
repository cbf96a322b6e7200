// InstanceSpec: one inferd instance behind the router (its role and its http://host:port), and
// the parsers of --instance / --prefill / --decode URLs and of the --instances-file lines.
// Plain data; the router's pool (instance_pool.h) keeps each instance's state.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace inferd {

// What an instance does (its `inferd serve --role`).
enum class InstanceRole { kBoth, kPrefill, kDecode };

// "both", "prefill", "decode".
const char* role_name(InstanceRole role);

struct InstanceSpec {
  InstanceRole role = InstanceRole::kBoth;
  std::string url;   // "http://host:port", as written (no trailing slash): the instance's name
  std::string host;  // "127.0.0.1"
  std::string port;  // "8000"

  bool operator==(const InstanceSpec& o) const { return role == o.role && url == o.url; }
};

// http://host:port (port required, no path). `what` names the source in the error
// ("--prefill", "instances.txt line 3").
Expected<InstanceSpec> parse_instance_url(InstanceRole role, std::string_view url, const std::string& what);

// An instances file: one instance a line, "both|prefill|decode URL"; '#' starts a comment;
// blank lines are skipped. A bad line fails the whole file with "<path> line N: ...".
Expected<std::vector<InstanceSpec>> parse_instances_file(std::string_view text, const std::string& path);

}  // namespace inferd
