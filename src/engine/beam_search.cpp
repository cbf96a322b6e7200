#include "engine/beam_search.h"

#include <algorithm>
#include <cmath>

namespace inferd {

double Beam::score(float length_penalty) const {
  const size_t length = std::max<size_t>(1, tokens.size() - (complete && !tokens.empty() ? 1 : 0));
  return logprob / std::pow(static_cast<double>(length), static_cast<double>(length_penalty));
}

std::shared_ptr<BeamSearch> BeamSearch::start(RequestSpec prompt, BeamSearchParams params, Submit submit,
                                              Abort abort, Done done) {
  auto search = std::make_shared<BeamSearch>(std::move(prompt), std::move(params), std::move(submit),
                                             std::move(abort), std::move(done));
  std::lock_guard<std::mutex> lock(search->mutex_);
  search->live_.emplace_back();  // the empty beam: the prompt alone
  search->submit_step();
  return search;
}

BeamSearch::BeamSearch(RequestSpec prompt, BeamSearchParams params, Submit submit, Abort abort, Done done)
    : prompt_(std::move(prompt)),
      params_(std::move(params)),
      submit_(std::move(submit)),
      abort_(std::move(abort)),
      done_(std::move(done)) {
  // Every step asks for one token and the top 2 x width log-probabilities of the model's own
  // distribution; it neither samples nor stops on its own.
  prompt_.sampling = SamplingParams{};
  prompt_.sampling.logprobs = std::max(2 * std::max(1, params_.width), params_.logprobs.value_or(0));
  prompt_.limits = GenerationLimits{};
  prompt_.limits.max_tokens = 1;
  prompt_.limits.ignore_eos = true;
  prompt_.n = 1;
}

void BeamSearch::submit_step() {
  ++steps_;
  candidates_.assign(live_.size(), {});
  in_flight_.assign(live_.size(), 0);
  pending_ = live_.size();
  std::weak_ptr<BeamSearch> self = weak_from_this();
  for (size_t i = 0; i < live_.size(); ++i) {
    RequestSpec spec = prompt_;
    spec.prompt.insert(spec.prompt.end(), live_[i].tokens.begin(), live_[i].tokens.end());
    // The engine may answer on its thread before submit returns: the callback takes the lock.
    in_flight_[i] = submit_(std::move(spec), [self, i](const StepOutput& out) {
      if (auto search = self.lock()) search->on_output(i, out);
    });
  }
}

void BeamSearch::on_output(size_t beam, const StepOutput& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ended_ || beam >= candidates_.size()) return;
  if (!out.error.empty()) {
    in_flight_[beam] = 0;  // over already
    return finish(out.error, out.internal);
  }
  if (!out.top_logprobs.empty()) candidates_[beam] = out.top_logprobs.front();
  if (!out.finished) return;
  if (candidates_[beam].empty())
    return finish("beam search: the engine returned no log-probabilities for a step", true);
  in_flight_[beam] = 0;
  if (--pending_ == 0) expand();
}

void BeamSearch::expand() {
  std::vector<Beam> next;
  for (size_t i = 0; i < live_.size(); ++i) {
    for (const auto& [token, logprob] : candidates_[i]) {
      Beam b;
      b.tokens = live_[i].tokens;
      b.tokens.push_back(token);
      b.logprob = live_[i].logprob + static_cast<double>(logprob);
      if (params_.logprobs) {
        b.token_logprobs = live_[i].token_logprobs;
        b.token_logprobs.push_back(logprob);
        b.top_logprobs = live_[i].top_logprobs;
        const auto& all = candidates_[i];
        b.top_logprobs.emplace_back(
            all.begin(), all.begin() + std::min<std::ptrdiff_t>(*params_.logprobs,
                                                                static_cast<std::ptrdiff_t>(all.size())));
      }
      b.complete = std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) !=
                   params_.stop_token_ids.end();
      next.push_back(std::move(b));
    }
  }
  // The width likeliest continuations; those that ended are complete, the rest go on.
  std::stable_sort(next.begin(), next.end(),
                   [](const Beam& a, const Beam& b) { return a.logprob > b.logprob; });
  if (next.size() > static_cast<size_t>(params_.width)) next.resize(static_cast<size_t>(params_.width));
  live_.clear();
  for (Beam& b : next) (b.complete ? complete_ : live_).push_back(std::move(b));
  if (live_.empty() || steps_ >= params_.max_tokens) return finish("", false);
  submit_step();
}

void BeamSearch::finish(const std::string& error, bool internal) {
  ended_ = true;
  for (RequestId id : in_flight_) {
    if (id != 0) abort_(id);
  }
  in_flight_.clear();
  std::vector<Beam> beams;
  if (error.empty()) {
    beams = std::move(complete_);
    for (Beam& b : live_) beams.push_back(std::move(b));
    const float penalty = params_.length_penalty;
    std::stable_sort(beams.begin(), beams.end(),
                     [penalty](const Beam& a, const Beam& b) { return a.score(penalty) > b.score(penalty); });
    if (beams.size() > static_cast<size_t>(params_.width)) beams.resize(static_cast<size_t>(params_.width));
  }
  Done done = std::move(done_);
  done(std::move(beams), error, internal);
}

void BeamSearch::cancel() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!ended_) finish("aborted", false);
}

}  // namespace inferd
