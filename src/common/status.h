// Status and Expected<T>: how inferd reports errors that can happen in normal use.
// Every module boundary returns these; only server/ and apps/ turn them into HTTP or CLI errors.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "common/check.h"

namespace inferd {

enum class StatusCode {
  kOk,
  kInvalidArgument,  // the caller passed something wrong (flag, request field)
  kNotFound,         // a file, tensor or key that should exist does not
  kIoError,          // the operating system refused (open, mmap, read)
  kCorruptFile,      // a file's bytes contradict its format
  kUnsupported,      // valid input that inferd does not implement
  kResourceExhausted,
  kInternal,
};

// Outcome of an operation: ok, or a code plus a message naming what went wrong.
class [[nodiscard]] Status final {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "<context>: <message>".
  Status with_context(const std::string& context) const { return Status(code_, context + ": " + message_); }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status not_found(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
inline Status io_error(std::string m) {
  return {StatusCode::kIoError, std::move(m)};
}
inline Status corrupt_file(std::string m) {
  return {StatusCode::kCorruptFile, std::move(m)};
}
inline Status unsupported(std::string m) {
  return {StatusCode::kUnsupported, std::move(m)};
}

// A value of type T or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Expected final {
 public:
  Expected(T value) : storage_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Expected(Status status) : storage_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    INFERD_CHECK(!std::get<Status>(storage_).is_ok());
  }

  bool has_value() const { return std::holds_alternative<T>(storage_); }
  explicit operator bool() const { return has_value(); }

  T& value() & {
    INFERD_CHECK(has_value());
    return std::get<T>(storage_);
  }
  const T& value() const& {
    INFERD_CHECK(has_value());
    return std::get<T>(storage_);
  }
  T&& value() && {
    INFERD_CHECK(has_value());
    return std::get<T>(std::move(storage_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // The error; Status::ok() when a value is held.
  Status status() const { return has_value() ? Status::ok() : std::get<Status>(storage_); }

 private:
  std::variant<T, Status> storage_;
};

}  // namespace inferd

#define INFERD_CONCAT_INNER(a, b) a##b
#define INFERD_CONCAT(a, b) INFERD_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` (a Status) is not ok.
#define INFERD_RETURN_IF_ERROR(expr)                    \
  do {                                                  \
    ::inferd::Status inferd_status_ = (expr);           \
    if (!inferd_status_.is_ok()) return inferd_status_; \
  } while (0)

// `lhs = value of expr` (an Expected), or returns its Status from the enclosing function.
#define INFERD_ASSIGN_OR_RETURN(lhs, expr) \
  INFERD_ASSIGN_OR_RETURN_IMPL(INFERD_CONCAT(inferd_expected_, __LINE__), lhs, expr)
#define INFERD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.has_value()) return tmp.status();         \
  lhs = std::move(tmp).value()
