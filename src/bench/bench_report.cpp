#include "bench/bench_report.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace inferd {

using json = nlohmann::json;

namespace {

std::string line(const char* label, double v, const char* fmt = "%.2f") {
  char num[64], out[128];
  std::snprintf(num, sizeof num, fmt, v);
  std::snprintf(out, sizeof out, "%-40s %-10s\n", label, num);
  return out;
}

std::string rule(const char* title, char fill) {
  const std::string t = title[0] != '\0' ? std::string(" ") + title + " " : "";
  const size_t width = 50;
  const size_t left = (width - t.size()) / 2;
  return std::string(left, fill) + t + std::string(width - left - t.size(), fill) + "\n";
}

void add_distribution(std::string* out, const char* title, const char* key, const Distribution& d) {
  *out += rule(title, '-');
  const std::string k = key;
  *out += line(("Mean " + k + " (ms):").c_str(), d.mean * 1e3);
  *out += line(("Median " + k + " (ms):").c_str(), d.p50 * 1e3);
  *out += line(("P90 " + k + " (ms):").c_str(), d.p90 * 1e3);
  *out += line(("P95 " + k + " (ms):").c_str(), d.p95 * 1e3);
  *out += line(("P99 " + k + " (ms):").c_str(), d.p99 * 1e3);
  *out += line(("Max " + k + " (ms):").c_str(), d.max * 1e3);
}

void put_distribution(json* j, const char* key, const Distribution& d) {
  const std::string k = key;
  (*j)["mean_" + k + "_ms"] = d.mean * 1e3;
  (*j)["median_" + k + "_ms"] = d.p50 * 1e3;
  (*j)["std_" + k + "_ms"] = d.stddev * 1e3;
  (*j)["p90_" + k + "_ms"] = d.p90 * 1e3;
  (*j)["p95_" + k + "_ms"] = d.p95 * 1e3;
  (*j)["p99_" + k + "_ms"] = d.p99 * 1e3;
  (*j)["max_" + k + "_ms"] = d.max * 1e3;
}

std::string slo_text(const Slo& slo) {
  std::string s;
  auto add = [&](const char* name, const std::optional<double>& v) {
    if (!v) return;
    if (!s.empty()) s += ",";
    s += std::string(name) + "=" + std::to_string(static_cast<int64_t>(*v * 1e3)) + "ms";
  };
  add("ttft", slo.ttft);
  add("tpot", slo.tpot);
  add("e2el", slo.e2el);
  return s;
}

}  // namespace

std::string format_report(const BenchSummary& s, const BenchRunInfo& info) {
  std::string out = rule("Serving Benchmark Result", '=');
  out += line("Successful requests:", static_cast<double>(s.completed), "%.0f");
  out += line("Failed requests:", static_cast<double>(s.failed), "%.0f");
  if (info.options.max_concurrency > 0)
    out += line("Maximum request concurrency:", static_cast<double>(info.options.max_concurrency), "%.0f");
  out += line("Benchmark duration (s):", s.duration);
  out += line("Total input tokens:", static_cast<double>(s.total_input_tokens), "%.0f");
  out += line("Total generated tokens:", static_cast<double>(s.total_output_tokens), "%.0f");
  out += line("Request throughput (req/s):", s.request_throughput);
  if (info.slo.ttft || info.slo.tpot || info.slo.e2el)
    out += line(("Request goodput (req/s, " + slo_text(info.slo) + "):").c_str(), s.goodput);
  out += line("Output token throughput (tok/s):", s.output_throughput);
  out += line("Total token throughput (tok/s):", s.total_token_throughput);
  out += line("Max concurrent requests:", static_cast<double>(s.max_concurrency), "%.0f");
  add_distribution(&out, "Time to First Token", "TTFT", s.ttft);
  add_distribution(&out, "Time per Output Token (excl. 1st token)", "TPOT", s.tpot);
  add_distribution(&out, "Inter-token Latency", "ITL", s.itl);
  add_distribution(&out, "End-to-end Latency", "E2EL", s.e2el);
  out += std::string(50, '=') + "\n";
  return out;
}

json report_json(const BenchSummary& s, const ServeRun& run, const BenchRunInfo& info) {
  json j;
  j["backend"] = "openai";
  j["base_url"] = info.options.base_url;
  j["endpoint"] = info.options.endpoint;
  j["model_id"] = info.model;
  j["dataset"] = info.dataset;
  j["num_prompts"] = s.num_requests;
  j["request_rate"] = std::isinf(info.options.request_rate) ? json("inf") : json(info.options.request_rate);
  j["burstiness"] = info.options.burstiness;
  j["max_concurrency"] =
      info.options.max_concurrency > 0 ? json(info.options.max_concurrency) : json(nullptr);
  j["seed"] = info.options.seed;
  j["duration"] = s.duration;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["request_throughput"] = s.request_throughput;
  j["request_goodput"] = (info.slo.ttft || info.slo.tpot || info.slo.e2el) ? json(s.goodput) : json(nullptr);
  j["goodput_slo"] = slo_text(info.slo);
  j["output_throughput"] = s.output_throughput;
  j["total_token_throughput"] = s.total_token_throughput;
  j["max_concurrent_requests"] = s.max_concurrency;
  put_distribution(&j, "ttft", s.ttft);
  put_distribution(&j, "tpot", s.tpot);
  put_distribution(&j, "itl", s.itl);
  put_distribution(&j, "e2el", s.e2el);
  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(), errors = json::array(),
       requests = json::array();
  for (const RequestRecord& r : run.records) {
    input_lens.push_back(r.prompt_tokens);
    output_lens.push_back(r.output_tokens);
    ttfts.push_back(r.ttft);
    errors.push_back(r.error);
    requests.push_back({{"success", r.success},
                        {"error", r.error},
                        {"start", r.start},
                        {"ttft", r.ttft},
                        {"latency", r.latency},
                        {"prompt_tokens", r.prompt_tokens},
                        {"output_tokens", r.output_tokens},
                        {"expected_output_tokens", r.expected_output_tokens},
                        {"itl", r.itl}});
  }
  j["input_lens"] = input_lens;
  j["output_lens"] = output_lens;
  j["ttfts"] = ttfts;
  j["errors"] = errors;
  j["requests"] = requests;
  return j;
}

std::string format_sweep(const std::vector<SweepPoint>& points) {
  std::string out =
      "| max concurrency | req/s | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | failed |\n"
      "|---|---|---|---|---|---|---|\n";
  char row[256];
  for (const SweepPoint& p : points) {
    const BenchSummary& s = p.summary;
    std::snprintf(row, sizeof row, "| %lld | %.2f | %.1f | %.1f | %.1f | %.1f | %lld |\n",
                  static_cast<long long>(p.max_concurrency), s.request_throughput, s.output_throughput,
                  s.ttft.p50 * 1e3, s.ttft.p99 * 1e3, s.tpot.p50 * 1e3, static_cast<long long>(s.failed));
    out += row;
  }
  return out;
}

Status write_plots(const std::string& dir, const ServeRun& run, const std::vector<SweepPoint>& sweep) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error("--plot " + dir + ": cannot create it: " + ec.message());
  const fs::path d(dir);
  std::vector<double> ttfts;
  {
    std::ofstream lat(d / "latency.dat");
    for (const RequestRecord& r : run.records) {
      if (!r.success) continue;
      ttfts.push_back(r.ttft);
      lat << r.start << ' ' << r.ttft * 1e3 << ' ' << r.latency * 1e3 << '\n';
    }
  }
  std::sort(ttfts.begin(), ttfts.end());
  {
    std::ofstream cdf(d / "ttft_cdf.dat");
    for (size_t i = 0; i < ttfts.size(); ++i)
      cdf << ttfts[i] * 1e3 << ' ' << static_cast<double>(i + 1) / static_cast<double>(ttfts.size()) << '\n';
  }
  std::string script =
      "set terminal pngcairo size 900,560\nset grid\nset key left top\n"
      "set output '" +
      (d / "ttft_cdf.png").string() +
      "'\n"
      "set title 'TTFT CDF'\nset xlabel 'TTFT (ms)'\nset ylabel 'share of requests'\n"
      "plot '" +
      (d / "ttft_cdf.dat").string() +
      "' using 1:2 with steps lw 2 title 'TTFT'\n"
      "set output '" +
      (d / "latency_over_time.png").string() +
      "'\n"
      "set title 'Latency over the run'\nset xlabel 'request sent at (s)'\nset ylabel 'ms'\n"
      "plot '" +
      (d / "latency.dat").string() +
      "' using 1:2 with points pt 7 ps 0.6 title 'TTFT', '' using 1:3 "
      "with points pt 6 ps 0.6 title 'E2E latency'\n";
  if (sweep.size() >= 2) {
    std::ofstream sw(d / "sweep.dat");
    for (const SweepPoint& p : sweep)
      sw << p.summary.output_throughput << ' ' << p.summary.ttft.p99 * 1e3 << ' ' << p.max_concurrency
         << '\n';
    script += "set output '" + (d / "throughput_vs_ttft_p99.png").string() +
              "'\n"
              "set title 'Throughput vs TTFT p99 (labels: max concurrency)'\nset xlabel 'output tokens/s'\n"
              "set ylabel 'TTFT p99 (ms)'\n"
              "plot '" +
              (d / "sweep.dat").string() +
              "' using 1:2 with linespoints lw 2 pt 7 title 'inferd bench', "
              "'' using 1:2:3 with labels offset 1,1 notitle\n";
  }
  {
    std::ofstream gp(d / "plots.gp");
    gp << script;
  }
  const std::string command = "gnuplot '" + (d / "plots.gp").string() + "' 2>&1";
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return io_error("--plot: cannot run gnuplot");
  std::string output;
  char buf[512];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) output.append(buf, n);
  const int rc = ::pclose(p);
  if (rc != 0) {
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 127)
      return not_found("--plot needs gnuplot (Debian package gnuplot-nox; scripts/setup installs it)");
    return io_error("--plot: gnuplot failed: " + output.substr(0, 300));
  }
  return Status::ok();
}

}  // namespace inferd
