// Rendering of the command-specific report sections (diagnosis, bench, validation), shared by
// the text formats so each format file stays about its own layout.
#pragma once

#include <string>
#include <vector>

#include "reports/report.h"

namespace ckcheck {

std::vector<std::string> console_sections(const Report& r);
std::vector<std::string> markdown_sections(const Report& r);
std::string html_sections(const Report& r);

}  // namespace ckcheck
