// Text helpers: numbers read from option values (the whole text or nothing, so "4x" or "" is an
// error for the caller to word, never a silent 4 or 0), sizes, sites named in messages, and
// arguments quoted for a shell.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ckcheck {

std::optional<long long> parse_int(const std::string& text);
/// Finite numbers only.
std::optional<double> parse_double(const std::string& text);

/// The first line of a message (errors from TorchScript or c10 carry tracebacks after it).
std::string first_line(const std::string& message);

/// "8GiB", "512MiB", "1.5GB", "1000000" -> bytes; throws UsageError otherwise.
int64_t parse_bytes(const std::string& text);
/// 1536 -> "1.5 KiB".
std::string format_bytes(double bytes);

/// What `text` says after `key`, up to the first of the characters `ends` (or its end); "" when
/// `key` is not in it: the site in "ckcheck::checkpoint(blocks.1): ...", the parameter in DDP's
/// "... with name blocks.0.w has been marked ...".
std::string text_after(const std::string& text, const std::string& key, const char* ends);

/// Whether `text` names the module path `site` as a whole: "threw at blocks.1: ..." names blocks.1,
/// not blocks.10 nor blocks.1.attn.
bool names_site(const std::string& text, const std::string& site);

/// Shell-quotes one argument when it needs it ('blocks.*' stays one word, and no glob expands).
std::string shell_quote(const std::string& arg);

}  // namespace ckcheck
