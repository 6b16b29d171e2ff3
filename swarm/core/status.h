// status: error codes, Status and Result<T>, the project's only error channel.
//
// Operations that can fail on bad input or a bad peer return Status or
// Result<T>; they never throw or abort. Programming errors use SWARM_CHECK.
//
//   swarm::Result<int> parse_port(std::string_view s);
//   SWARM_ASSIGN_OR_RETURN(int port, parse_port(text));
//   if (port == 0) return swarm::invalid_argument("port 0 is reserved");
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/core.h>

namespace swarm {

enum class StatusCode : uint8_t {
  ok = 0,
  invalid_argument,
  out_of_range,
  not_found,
  already_exists,
  failed_precondition,
  permission_denied,
  resource_exhausted,
  unavailable,
  deadline_exceeded,
  cancelled,
  data_loss,
  unimplemented,
  internal,
};

constexpr std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::out_of_range: return "out_of_range";
    case StatusCode::not_found: return "not_found";
    case StatusCode::already_exists: return "already_exists";
    case StatusCode::failed_precondition: return "failed_precondition";
    case StatusCode::permission_denied: return "permission_denied";
    case StatusCode::resource_exhausted: return "resource_exhausted";
    case StatusCode::unavailable: return "unavailable";
    case StatusCode::deadline_exceeded: return "deadline_exceeded";
    case StatusCode::cancelled: return "cancelled";
    case StatusCode::data_loss: return "data_loss";
    case StatusCode::unimplemented: return "unimplemented";
    case StatusCode::internal: return "internal";
  }
  return "unknown";
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }

  bool is_ok() const { return code_ == StatusCode::ok; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  std::string to_string() const {
    if (is_ok()) return "ok";
    return fmt::format("{}: {}", status_code_name(code_), message_);
  }

  // Adds context on the way up: "loading checkpoint: file not found".
  Status with_context(std::string_view context) const {
    if (is_ok()) return *this;
    return Status(code_, fmt::format("{}: {}", context, message_));
  }

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

#define SWARM_DEFINE_STATUS_FACTORY(name)                                          \
  template <typename... Args>                                                      \
  Status name(fmt::format_string<Args...> format, Args&&... args) {                \
    return Status(StatusCode::name, fmt::format(format, std::forward<Args>(args)...)); \
  }
// Factories named after their code: swarm::invalid_argument("bad rank {}", r).
SWARM_DEFINE_STATUS_FACTORY(invalid_argument)
SWARM_DEFINE_STATUS_FACTORY(out_of_range)
SWARM_DEFINE_STATUS_FACTORY(not_found)
SWARM_DEFINE_STATUS_FACTORY(already_exists)
SWARM_DEFINE_STATUS_FACTORY(failed_precondition)
SWARM_DEFINE_STATUS_FACTORY(permission_denied)
SWARM_DEFINE_STATUS_FACTORY(resource_exhausted)
SWARM_DEFINE_STATUS_FACTORY(unavailable)
SWARM_DEFINE_STATUS_FACTORY(deadline_exceeded)
SWARM_DEFINE_STATUS_FACTORY(cancelled)
SWARM_DEFINE_STATUS_FACTORY(data_loss)
SWARM_DEFINE_STATUS_FACTORY(unimplemented)
SWARM_DEFINE_STATUS_FACTORY(internal)
#undef SWARM_DEFINE_STATUS_FACTORY

[[noreturn]] void fatal_error(const char* file, int line, std::string_view message);

// A value or the Status that explains its absence (std::expected is C++23).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : storage_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : storage_(std::move(status)) {  // NOLINT
    if (std::get<Status>(storage_).is_ok()) {
      storage_ = Status(StatusCode::internal, "Result constructed from an ok Status");
    }
  }

  bool is_ok() const { return std::holds_alternative<T>(storage_); }
  explicit operator bool() const { return is_ok(); }

  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(storage_);
  }

  T& value() & { check(); return std::get<T>(storage_); }
  const T& value() const& { check(); return std::get<T>(storage_); }
  T&& value() && { check(); return std::get<T>(std::move(storage_)); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  T value_or(T fallback) const& { return is_ok() ? std::get<T>(storage_) : std::move(fallback); }

 private:
  void check() const {
    if (!is_ok()) fatal_error(__FILE__, __LINE__, "Result::value() on error: " + status().to_string());
  }
  std::variant<T, Status> storage_;
};

}  // namespace swarm

#define SWARM_STATUS_CONCAT_INNER(a, b) a##b
#define SWARM_STATUS_CONCAT(a, b) SWARM_STATUS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` failed.
#define SWARM_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::swarm::Status swarm_status_ = (expr);          \
    if (!swarm_status_.is_ok()) return swarm_status_; \
  } while (0)

// `lhs = value of expr`, or returns its Status from the enclosing function.
#define SWARM_ASSIGN_OR_RETURN(lhs, expr) \
  SWARM_ASSIGN_OR_RETURN_IMPL(SWARM_STATUS_CONCAT(swarm_result_, __LINE__), lhs, expr)
#define SWARM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.is_ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
