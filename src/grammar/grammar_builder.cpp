#include "grammar/grammar_builder.h"

#include <algorithm>
#include <numeric>

#include "common/check.h"
#include "grammar/grammar_vocab.h"

namespace inferd {

namespace {

uint64_t element_key(const GrammarElement& e) {
  return (static_cast<uint64_t>(e.kind) << 32) | e.value;
}

}  // namespace

uint32_t GrammarBuilder::new_rule(std::string name) {
  names_.push_back(std::move(name));
  alternatives_.emplace_back();
  return static_cast<uint32_t>(names_.size() - 1);
}

uint32_t GrammarBuilder::byte_set_index(const ByteSet& set) {
  auto [it, inserted] = byte_set_ids_.emplace(set.words, static_cast<uint32_t>(byte_sets_.size()));
  if (inserted) byte_sets_.push_back(set);
  return it->second;
}

Expected<std::shared_ptr<const Grammar>> GrammarBuilder::build(const std::vector<GbnfRule>& rules) {
  for (const GbnfRule& r : rules) rule_ids_.emplace(r.name, new_rule(r.name));
  if (!rule_ids_.contains("root")) return invalid_argument("gbnf: the grammar has no 'root' rule");
  for (const GbnfRule& r : rules) {
    current_rule_ = r.name;
    generated_ = 0;
    lower_alternatives(r.body, rule_ids_.at(r.name));
    if (!error_.is_ok()) return error_;
  }
  INFERD_RETURN_IF_ERROR(check_left_recursion());
  return flatten();
}

void GrammarBuilder::lower_alternatives(const GbnfExpr& alts, uint32_t rule) {
  INFERD_CHECK(alts.kind == GbnfExpr::Kind::kAlternatives);
  for (const GbnfExpr& seq : alts.children) {
    Alternative alt;
    lower_sequence(seq, &alt);
    alternatives_[rule].push_back(std::move(alt));
  }
}

void GrammarBuilder::lower_sequence(const GbnfExpr& seq, Alternative* out) {
  if (seq.kind != GbnfExpr::Kind::kSequence) {
    lower_item(seq, out);
    return;
  }
  for (const GbnfExpr& item : seq.children) lower_item(item, out);
}

void GrammarBuilder::lower_item(const GbnfExpr& item, Alternative* out) {
  switch (item.kind) {
    case GbnfExpr::Kind::kSequence: lower_sequence(item, out); break;
    case GbnfExpr::Kind::kCodepoints: lower_codepoints(item.codepoints, out); break;
    case GbnfExpr::Kind::kRuleRef: {
      auto it = rule_ids_.find(item.name);
      if (it == rule_ids_.end()) {
        if (error_.is_ok()) {
          error_ = invalid_argument("gbnf: line " + std::to_string(item.line) + ", column " +
                                    std::to_string(item.column) + ": undefined rule '" + item.name + "'");
        }
        return;
      }
      out->push_back({GrammarElementKind::kRule, it->second});
      break;
    }
    case GbnfExpr::Kind::kAlternatives:
      if (item.children.size() == 1) {
        lower_sequence(item.children[0], out);
      } else {
        const uint32_t rule = new_rule(current_rule_ + "_" + std::to_string(generated_++));
        lower_alternatives(item, rule);
        out->push_back({GrammarElementKind::kRule, rule});
      }
      break;
    case GbnfExpr::Kind::kRepeat: lower_repeat(item, out); break;
  }
}

// A class of single-byte characters is one terminal; others become a rule with one alternative
// per UTF-8 byte-range sequence (sequences that differ only in their first byte share one).
void GrammarBuilder::lower_codepoints(const CodepointSet& set, Alternative* out) {
  if (set.empty()) {
    // Matches nothing: a terminal with no bytes.
    out->push_back({GrammarElementKind::kBytes, byte_set_index(ByteSet{})});
    return;
  }
  const auto& ranges = set.ranges();
  if (ranges.back().second < 0x80) {
    ByteSet bytes;
    for (const auto& r : ranges)
      bytes.set_range(static_cast<uint8_t>(r.first), static_cast<uint8_t>(r.second));
    out->push_back({GrammarElementKind::kBytes, byte_set_index(bytes)});
    return;
  }
  auto [it, inserted] = class_rules_.emplace(ranges, 0);
  if (inserted) {
    it->second = new_rule(current_rule_ + "_char" + std::to_string(generated_++));
    std::vector<std::pair<std::vector<std::pair<uint8_t, uint8_t>>, ByteSet>> groups;  // tail -> first bytes
    for (const Utf8Sequence& s : utf8_sequences(set)) {
      std::vector<std::pair<uint8_t, uint8_t>> tail(s.ranges.begin() + 1, s.ranges.begin() + s.num_bytes);
      auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == tail; });
      if (g == groups.end()) {
        groups.emplace_back(tail, ByteSet{});
        g = groups.end() - 1;
      }
      g->second.set_range(s.ranges[0].first, s.ranges[0].second);
    }
    for (const auto& [tail, first] : groups) {
      Alternative alt;
      alt.push_back({GrammarElementKind::kBytes, byte_set_index(first)});
      for (const auto& r : tail) {
        ByteSet b;
        b.set_range(r.first, r.second);
        alt.push_back({GrammarElementKind::kBytes, byte_set_index(b)});
      }
      alternatives_[it->second].push_back(std::move(alt));
    }
  }
  out->push_back({GrammarElementKind::kRule, it->second});
}

// One element standing for `item`: itself when it lowers to one, else a rule of it.
GrammarElement GrammarBuilder::as_single_element(const GbnfExpr& item) {
  Alternative alt;
  lower_item(item, &alt);
  if (alt.size() == 1) return alt[0];
  const uint32_t rule = new_rule(current_rule_ + "_" + std::to_string(generated_++));
  alternatives_[rule].push_back(std::move(alt));
  return {GrammarElementKind::kRule, rule};
}

// x{m,n}: m copies of x, then a chain of optional ones (x{0,k} ::= x x{0,k-1} | ε);
// x{m,}: m copies, then x* ::= x x* | ε. Chains are shared between identical repetitions.
void GrammarBuilder::lower_repeat(const GbnfExpr& rep, Alternative* out) {
  const GrammarElement e = as_single_element(rep.children[0]);
  for (int i = 0; i < rep.min; ++i) out->push_back(e);
  const int extra = rep.max ? *rep.max - rep.min : -1;
  if (extra == 0) return;
  const auto key = std::make_pair(element_key(e), std::make_pair(extra, 0));
  if (auto it = repeat_rules_.find(key); it != repeat_rules_.end()) {
    out->push_back({GrammarElementKind::kRule, it->second});
    return;
  }
  if (extra < 0) {
    const uint32_t star = new_rule(current_rule_ + "_star" + std::to_string(generated_++));
    alternatives_[star].push_back({e, {GrammarElementKind::kRule, star}});
    alternatives_[star].push_back({});
    repeat_rules_.emplace(key, star);
    out->push_back({GrammarElementKind::kRule, star});
    return;
  }
  uint32_t previous = 0;
  for (int k = 1; k <= extra; ++k) {
    const auto k_key = std::make_pair(element_key(e), std::make_pair(k, 0));
    if (auto it = repeat_rules_.find(k_key); it != repeat_rules_.end()) {
      previous = it->second;
      continue;
    }
    const uint32_t opt = new_rule(current_rule_ + "_opt" + std::to_string(generated_++));
    if (k == 1) {
      alternatives_[opt].push_back({e});
    } else {
      alternatives_[opt].push_back({e, {GrammarElementKind::kRule, previous}});
    }
    alternatives_[opt].push_back({});
    repeat_rules_.emplace(k_key, opt);
    chain_ranks_.emplace(opt, std::make_pair(element_key(e), k));
    previous = opt;
  }
  out->push_back({GrammarElementKind::kRule, previous});
}

// The matcher expands rules depth first, so a rule that can reach itself without consuming a byte
// would never stop: refuse it (llama.cpp does too).
Status GrammarBuilder::check_left_recursion() const {
  // Linear in the grammar's size, without recursion: a request's grammar may have hundreds of
  // thousands of rules chained in any order (a fixpoint over all rules took a pass per link, and a
  // recursive search overflowed the stack on a chain of 200,000).
  const size_t n = names_.size();
  // Nullable rules by a worklist: each alternative counts its elements not yet known nullable.
  std::vector<bool> nullable(n, false);
  std::vector<uint32_t> owner, remaining;       // per alternative without a terminal
  std::vector<std::vector<uint32_t>> users(n);  // rule -> those alternatives, per occurrence
  std::vector<uint32_t> work;
  for (size_t r = 0; r < n; ++r) {
    for (const Alternative& alt : alternatives_[r]) {
      if (std::any_of(alt.begin(), alt.end(),
                      [](const GrammarElement& e) { return e.kind != GrammarElementKind::kRule; }))
        continue;
      const auto a = static_cast<uint32_t>(owner.size());
      owner.push_back(static_cast<uint32_t>(r));
      remaining.push_back(static_cast<uint32_t>(alt.size()));
      for (const GrammarElement& e : alt) users[e.value].push_back(a);
      if (alt.empty() && !nullable[r]) {
        nullable[r] = true;
        work.push_back(static_cast<uint32_t>(r));
      }
    }
  }
  while (!work.empty()) {
    const uint32_t s = work.back();
    work.pop_back();
    for (uint32_t a : users[s]) {
      if (--remaining[a] == 0 && !nullable[owner[a]]) {
        nullable[owner[a]] = true;
        work.push_back(owner[a]);
      }
    }
  }
  // Edges r -> s: s is reachable at the start of r (after nullable elements only).
  std::vector<std::vector<uint32_t>> starts(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Alternative& alt : alternatives_[r]) {
      for (const GrammarElement& e : alt) {
        if (e.kind != GrammarElementKind::kRule) break;
        starts[r].push_back(e.value);
        if (!nullable[e.value]) break;
      }
    }
  }
  // A cycle among them, by a depth-first search with its own stack of (rule, next edge).
  std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> path;
  for (uint32_t root = 0; root < n; ++root) {
    if (color[root] != 0) continue;
    color[root] = 1;
    path.assign(1, {root, 0});
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == starts[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t s = starts[r][next++];
      if (color[s] == 1) {
        return invalid_argument("gbnf: left recursion through rule '" + names_[s] +
                                "' (a rule that can reach itself without consuming a character, e.g. a "
                                "repetition of something that can be empty)");
      }
      if (color[s] == 0) {
        color[s] = 1;
        path.emplace_back(s, 0);
      }
    }
  }
  return Status::ok();
}

std::shared_ptr<const Grammar> GrammarBuilder::flatten() const {
  std::vector<GrammarElement> elements = {{GrammarElementKind::kRule, rule_ids_.at("root")}, {}};
  std::vector<Grammar::Rule> rules(names_.size());
  for (size_t r = 0; r < names_.size(); ++r) {
    rules[r].name = names_[r];
    for (const Alternative& alt : alternatives_[r]) {
      rules[r].alternatives.push_back(static_cast<uint32_t>(elements.size()));
      elements.insert(elements.end(), alt.begin(), alt.end());
      elements.push_back({});
    }
  }
  // Within kShortTokenBytes bytes (each x takes at least one), x{0,k} and x{0,kShortTokenBytes + 1}
  // parse alike for every k past it: map the longer chain rules' positions onto that one.
  std::vector<uint32_t> short_positions;
  constexpr int kHorizonRank = static_cast<int>(kShortTokenBytes) + 1;
  for (const auto& [rule, chain] : chain_ranks_) {
    if (chain.second <= kHorizonRank) continue;
    const uint32_t target = repeat_rules_.at(std::make_pair(chain.first, std::make_pair(kHorizonRank, 0)));
    if (short_positions.empty()) {
      short_positions.resize(elements.size());
      std::iota(short_positions.begin(), short_positions.end(), 0u);
    }
    const auto& from = rules[rule].alternatives;
    const auto& to = rules[target].alternatives;
    INFERD_CHECK(from.size() == to.size());
    for (size_t a = 0; a < from.size(); ++a) {
      for (uint32_t o = 0;; ++o) {
        INFERD_CHECK(elements[from[a] + o].kind == elements[to[a] + o].kind);
        short_positions[from[a] + o] = to[a] + o;
        if (elements[from[a] + o].kind == GrammarElementKind::kEnd) break;
      }
    }
  }
  return std::make_shared<const Grammar>(std::move(elements), byte_sets_, std::move(rules),
                                         std::move(short_positions));
}

}  // namespace inferd
