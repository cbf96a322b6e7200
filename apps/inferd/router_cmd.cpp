#include "router_cmd.h"

#include "cli_error.h"
#include "common/log.h"

namespace inferd {

void add_router_flags(CLI::App* cmd, RouterFlags* f) {
  RouterOptions& o = f->options;
  cmd->add_option("--host", o.host, "address to listen on");
  cmd->add_option("--port", o.port, "port to listen on (0: any free port)");
  cmd->add_option("--instance", f->instances, "an instance of role both: http://host:port (repeatable)");
  cmd->add_option("--prefill", f->prefill, "a prefill instance: http://host:port (repeatable)");
  cmd->add_option("--decode", f->decode, "a decode instance: http://host:port (repeatable)");
  cmd->add_option("--instances-file", o.instances_file,
                  "one instance a line, 'both|prefill|decode URL', '#' comments; re-read when it changes")
      ->check(CLI::ExistingFile);
  cmd->add_option("--policy", f->policy, "round-robin, least-load or cache-aware (default)")
      ->check(CLI::IsMember({"round-robin", "least-load", "cache-aware"}));
  cmd->add_option("--disagg-min-tokens", o.planner.disagg_min_tokens,
                  "estimated uncached prompt tokens from which a request goes prefill -> decode")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--health-interval", o.health_interval_seconds,
                  "seconds between health checks (and /metrics scrapes) of each instance")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--request-timeout", o.request_timeout_seconds,
                  "seconds an instance may take to answer (a stream: between two chunks)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--api-key", o.api_key, "require 'Authorization: Bearer KEY' from clients");
  cmd->add_option("--balance-abs-threshold", o.planner.cache_aware.balance_abs_threshold,
                  "cache-aware: load difference beyond which the least loaded instance is chosen")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--balance-rel-threshold", o.planner.cache_aware.balance_rel_threshold,
                  "cache-aware: ... when the busiest also exceeds this multiple of the idlest")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--cache-threshold", o.planner.cache_aware.cache_threshold,
                  "cache-aware: matched share of the prompt from which the best match is chosen")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--shutdown-grace", o.shutdown_grace_seconds,
                  "on SIGTERM, seconds in-flight requests get to finish")
      ->check(CLI::NonNegativeNumber);
}

int run_router(const RouterFlags& flags) {
  RouterOptions options = flags.options;
  const auto policy = parse_policy(flags.policy);
  if (!policy) return fail(policy.status().message());
  options.planner.policy = *policy;
  auto add = [&](InstanceRole role, const std::vector<std::string>& urls, const char* flag) -> Status {
    for (const std::string& url : urls) {
      INFERD_ASSIGN_OR_RETURN(InstanceSpec spec, parse_instance_url(role, url, flag));
      options.instances.push_back(std::move(spec));
    }
    return Status::ok();
  };
  for (const Status& s : {add(InstanceRole::kBoth, flags.instances, "--instance"),
                          add(InstanceRole::kPrefill, flags.prefill, "--prefill"),
                          add(InstanceRole::kDecode, flags.decode, "--decode")}) {
    if (!s.is_ok()) return fail(s.message());
  }
  if (Status s = options.validate(); !s.is_ok()) return fail(s.message());
  RouterServer server(options);
  if (Status s = server.listen(); !s.is_ok()) return fail(s.message());
  log_info("router listening on http://" + options.host + ":" + std::to_string(server.port()),
           {{"policy", flags.policy}, {"instances", static_cast<int64_t>(options.instances.size())}});
  return server.run();
}

}  // namespace inferd
