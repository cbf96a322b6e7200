// jinja2's list filters: the builtins that take or build sequences (first, last, items, join,
// list, map, min, max, select, reject, selectattr, rejectattr, reverse, sort, sum, unique,
// dictsort). apply_filter (jinja_filters.cpp) dispatches to them.
#pragma once

#include "common/status.h"
#include "jinja/jinja_builtins.h"
#include "jinja/jinja_value.h"

namespace inferd::jinja::list_filters {

Expected<Value> dictsort(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> first(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> last(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> items(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> join(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> list(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> map(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> max(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> min(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> select(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> reject(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> selectattr(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> rejectattr(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> reverse(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> sort(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> sum(const Value& in, const CallArgs& args, const BuiltinLimits& limits);
Expected<Value> unique(const Value& in, const CallArgs& args, const BuiltinLimits& limits);

}  // namespace inferd::jinja::list_filters
