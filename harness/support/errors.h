// Errors that are the user's to fix (a bad option, a missing file, an unknown name): the CLI prints
// their one-line message and exits with status 2.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace ckcheck {

class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

/// Bad input in a named field of a request (sites, input_shape, amp, a model option such as
/// hidden): the library names fields, never the flag or argument that gave them. A field is
/// written @name in the message, after a space or a bracket or at its start ("@input_range '5,1':
/// HI must be above LO"); what() gives the bare names, and a front end renders them its own way
/// (the CLI as the flag of the option-table row that sets the field: --input-range).
class FieldError : public UsageError {
 public:
  FieldError(std::string field, std::string text);
  /// The field the error is about.
  const std::string& field() const { return field_; }
  /// The message with each @name given as `name_of(name)`.
  std::string render(const std::function<std::string(const std::string&)>& name_of) const;

 private:
  std::string field_;
  std::string text_;
};

/// A problem in what the user handed ckcheck that shows only once a step runs -- a factory's loss
/// that raises, an engine option of the wrong type: bad input (exit 2), not a step that fails to
/// compare. The Runner lets it through where it keeps a step's own error.
class SetupError : public UsageError {
 public:
  using UsageError::UsageError;
};

/// The run was interrupted (a SIGINT or Ctrl-C reached the model's Python code): nothing is judged,
/// no report is written. The Runner lets it through.
class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted (SIGINT)") {}
};

/// Whether `e` is, or carries, an interruption: Interrupted, or a Python KeyboardInterrupt that
/// crossed into C++ (pybind11 and torch's autograd engine render it "KeyboardInterrupt: ...").
bool is_interruption(const std::exception& e);

/// In a catch that keeps a step's error: throws Interrupted for an interruption and rethrows a
/// SetupError; returns for every other error.
void rethrow_stops(const std::exception& e);

}  // namespace ckcheck
