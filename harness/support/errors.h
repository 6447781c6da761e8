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

}  // namespace ckcheck
