#include "engine/output_processor.h"

namespace inferd {

OutputProcessor::OutputProcessor(const Tokenizer* tokenizer, const OutputOptions& options)
    : tokenizer_(tokenizer),
      include_stop_(options.include_stop_str_in_output),
      prompt_head_(options.prompt_head),
      echo_(options.echo) {
  if (tokenizer_ != nullptr)
    detok_.emplace(*tokenizer_, options.stop, !options.skip_special_tokens, options.min_tokens);
  if (options.reasoning) splitter_.emplace(*options.reasoning, options.prompt_opens_think);
  if (options.tool_calls) tool_parser_.emplace(*options.tool_calls, options.max_tool_calls);
}

const std::vector<ToolCall>& OutputProcessor::tool_calls() const {
  static const std::vector<ToolCall> kNone;
  return tool_parser_ ? tool_parser_->calls() : kNone;
}

std::string OutputProcessor::detokenize(int32_t token, bool* stopped) {
  if (!detok_) {  // no tokenizer: the ids, space-separated
    std::string text = ids_.size() > 1 ? " " : "";
    return text.append(std::to_string(token));
  }
  auto piece = detok_->push(token);
  *stopped = piece.stopped;
  if (piece.stopped && include_stop_) piece.text += piece.matched_stop;
  return std::move(piece.text);
}

ChoiceDelta OutputProcessor::apply(const StepOutput& out, Clock::time_point at) {
  ChoiceDelta d;
  gaps_.clear();
  if (finished()) return d;
  if (!first_scheduled_ && out.first_scheduled) {
    first_scheduled_ = out.first_scheduled;
    cached_tokens_ = out.cached_tokens;
  }
  predicted_ += out.predicted_tokens;
  accepted_predicted_ += out.accepted_predicted_tokens;
  for (size_t k = 0; k < out.prompt_tokens.size(); ++k)
    prompt_logprobs_.push_back(
        {out.prompt_tokens[k], out.prompt_logprobs[k], out.prompt_top_logprobs[k], out.prompt_ranks[k]});
  std::string text = std::move(echo_);
  echo_.clear();
  for (size_t k = 0; k < out.new_tokens.size(); ++k) {
    const int32_t t = out.new_tokens[k];
    if (last_token_) gaps_.push_back(std::chrono::duration<double>(at - *last_token_).count());
    if (!first_token_) first_token_ = at;
    last_token_ = at;
    ids_.push_back(t);
    d.tokens.push_back(t);
    if (k < out.logprobs.size()) d.logprobs.push_back({t, out.logprobs[k], out.top_logprobs[k]});
    // A stop token that ends the choice adds no text unless asked for (as a stop string).
    const bool stop_token = out.finished && out.finish_reason == FinishReason::kStop &&
                            k + 1 == out.new_tokens.size() && !include_stop_;
    bool stopped = false;
    if (!stop_token) text += detokenize(t, &stopped);
    if (stopped) {  // the text ends before the stop string; later tokens are dropped
      finish_reason_ = FinishReason::kStop;
      d.stop_string = true;
      break;
    }
  }
  if (out.finished && !finished()) {
    finish_reason_ = out.finish_reason.value_or(FinishReason::kError);
    error_ = out.error;
    internal_error_ = out.internal;
    if (detok_) text += detok_->finish().text;  // text held back as a possible stop-string start
  }
  d.finished = finished();
  if (splitter_) {
    auto parts = splitter_->feed(text);
    if (d.finished) {
      auto rest = splitter_->finish();
      parts.reasoning += rest.reasoning;
      parts.content += rest.content;
    }
    d.content = std::move(parts.content);
    d.reasoning = std::move(parts.reasoning);
  } else {
    d.content = std::move(text);
  }
  if (tool_parser_) {
    auto parts = tool_parser_->feed(d.content);
    if (d.finished) {
      auto rest = tool_parser_->finish();
      parts.content += rest.content;
      parts.calls.insert(parts.calls.end(), rest.calls.begin(), rest.calls.end());
    }
    d.content = std::move(parts.content);
    d.tool_calls = std::move(parts.calls);
  }
  text_ += d.content;
  reasoning_ += d.reasoning;
  logprobs_.insert(logprobs_.end(), d.logprobs.begin(), d.logprobs.end());
  return d;
}

}  // namespace inferd
