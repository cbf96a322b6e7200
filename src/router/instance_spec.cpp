#include "router/instance_spec.h"

#include <sstream>

namespace inferd {

const char* role_name(InstanceRole role) {
  switch (role) {
    case InstanceRole::kBoth: return "both";
    case InstanceRole::kPrefill: return "prefill";
    case InstanceRole::kDecode: return "decode";
  }
  return "both";
}

Expected<InstanceSpec> parse_instance_url(InstanceRole role, std::string_view url, const std::string& what) {
  const std::string_view scheme = "http://";
  auto bad = [&](const std::string& why) {
    return invalid_argument(what + ": '" + std::string(url) + "': " + why + " (expected http://host:port)");
  };
  if (url.substr(0, scheme.size()) != scheme) return bad("not an http:// URL");
  std::string_view rest = url.substr(scheme.size());
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) return bad("a path is not allowed");
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) return bad("no port");
  InstanceSpec spec;
  spec.role = role;
  spec.host = std::string(rest.substr(0, colon));
  spec.port = std::string(rest.substr(colon + 1));
  if (spec.host.empty()) return bad("no host");
  if (spec.port.empty() || spec.port.size() > 5 ||
      spec.port.find_first_not_of("0123456789") != std::string::npos || std::stoi(spec.port) == 0 ||
      std::stoi(spec.port) > 65535)
    return bad("bad port");
  spec.url = "http://" + std::string(rest);
  return spec;
}

Expected<std::vector<InstanceSpec>> parse_instances_file(std::string_view text, const std::string& path) {
  std::vector<InstanceSpec> out;
  size_t line_no = 0;
  size_t at = 0;
  while (at <= text.size()) {
    size_t eol = text.find('\n', at);
    if (eol == std::string_view::npos) eol = text.size();
    std::string line(text.substr(at, eol - at));
    at = eol + 1;
    ++line_no;
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string role_word, url, extra;
    if (!(words >> role_word)) continue;  // blank or comment only
    const std::string where = path + " line " + std::to_string(line_no);
    InstanceRole role;
    if (role_word == "both") {
      role = InstanceRole::kBoth;
    } else if (role_word == "prefill") {
      role = InstanceRole::kPrefill;
    } else if (role_word == "decode") {
      role = InstanceRole::kDecode;
    } else {
      return invalid_argument(where + ": unknown role '" + role_word +
                              "' (expected both, prefill or decode URL)");
    }
    if (!(words >> url)) return invalid_argument(where + ": '" + role_word + "' without a URL");
    if (words >> extra) return invalid_argument(where + ": unexpected '" + extra + "' after the URL");
    INFERD_ASSIGN_OR_RETURN(InstanceSpec spec, parse_instance_url(role, url, where));
    for (const InstanceSpec& s : out) {
      if (s == spec)
        return invalid_argument(where + ": " + spec.url + " is listed twice as " + role_name(role));
    }
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace inferd
