// Precompiled for every ckcheck target: torch's headers dominate build time, and parsing them once
// per target instead of once per file is what keeps a 2-core build within minutes.
#pragma once

#include <torch/torch.h>
#include <torch/script.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>
