// Errors that are the user's to fix (a bad option, a missing file, an unknown name): the CLI prints
// their one-line message and exits with status 2.
#pragma once

#include <stdexcept>
#include <string>

namespace ckcheck {

class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace ckcheck
