#include "bench/bench_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

namespace inferd {

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Distribution summarize(std::vector<double> values) {
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  const double n = static_cast<double>(values.size());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double var = 0;
  for (double v : values) var += (v - d.mean) * (v - d.mean);
  d.stddev = std::sqrt(var / n);  // population deviation, as numpy's std
  d.p50 = percentile(values, 50);
  d.p90 = percentile(values, 90);
  d.p95 = percentile(values, 95);
  d.p99 = percentile(values, 99);
  d.max = values.back();
  return d;
}

Expected<Slo> parse_slo(const std::string& text) {
  Slo slo;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    const size_t eq = item.find('=');
    const auto bad = [&](const std::string& why) {
      return invalid_argument("--slo '" + text + "': " + why +
                              " (expected e.g. ttft=500ms,tpot=100ms,e2el=2s)");
    };
    if (eq == std::string::npos) return bad("'" + item + "' has no '='");
    const std::string key = item.substr(0, eq);
    std::string value = item.substr(eq + 1);
    double scale = 1e-3;  // a bare number is milliseconds
    if (value.size() > 2 && value.compare(value.size() - 2, 2, "ms") == 0) {
      value.resize(value.size() - 2);
    } else if (!value.empty() && value.back() == 's') {
      value.pop_back();
      scale = 1;
    }
    char* parse_end = nullptr;
    const double v = std::strtod(value.c_str(), &parse_end);
    if (value.empty() || parse_end != value.c_str() + value.size() || !(v > 0) || !std::isfinite(v))
      return bad("'" + item + "' is not a positive time");
    if (key == "ttft") {
      slo.ttft = v * scale;
    } else if (key == "tpot") {
      slo.tpot = v * scale;
    } else if (key == "e2el") {
      slo.e2el = v * scale;
    } else {
      return bad("unknown metric '" + key + "'");
    }
  }
  return slo;
}

int64_t max_concurrency(const std::vector<RequestRecord>& records) {
  std::vector<std::pair<double, int>> events;  // (time, +1 start / -1 end); ends sort first at ties
  for (const RequestRecord& r : records) {
    events.emplace_back(r.start, 1);
    events.emplace_back(r.start + r.latency, -1);
  }
  std::sort(events.begin(), events.end());
  int64_t now = 0, most = 0;
  for (const auto& [t, delta] : events) {
    now += delta;
    most = std::max(most, now);
  }
  return most;
}

BenchSummary summarize_run(const std::vector<RequestRecord>& records, double duration, const Slo& slo) {
  BenchSummary s;
  s.num_requests = static_cast<int64_t>(records.size());
  s.duration = duration;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2el.push_back(r.latency);
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    double request_tpot = 0;
    if (r.output_tokens > 1) {
      request_tpot = (r.latency - r.ttft) / static_cast<double>(r.output_tokens - 1);
      tpot.push_back(request_tpot);
    }
    const bool good = (!slo.ttft || r.ttft <= *slo.ttft) && (!slo.tpot || request_tpot <= *slo.tpot) &&
                      (!slo.e2el || r.latency <= *slo.e2el);
    if (good) ++s.good_requests;
  }
  if (duration > 0) {
    s.request_throughput = static_cast<double>(s.completed) / duration;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / duration;
    s.total_token_throughput = static_cast<double>(s.total_input_tokens + s.total_output_tokens) / duration;
    s.goodput = static_cast<double>(s.good_requests) / duration;
  }
  s.ttft = summarize(std::move(ttft));
  s.tpot = summarize(std::move(tpot));
  s.itl = summarize(std::move(itl));
  s.e2el = summarize(std::move(e2el));
  s.max_concurrency = max_concurrency(records);
  return s;
}

}  // namespace inferd
