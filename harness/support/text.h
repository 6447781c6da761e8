// Text helpers: numbers read from option values (the whole text or nothing, so "4x" or "" is an
// error for the caller to word, never a silent 4 or 0), sizes, sites named in messages, and
// arguments quoted for a shell.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ckcheck {

/// [+-]digits only (no space, no 0x).
std::optional<long long> parse_int(const std::string& text);
/// Finite decimal numbers only, as people write them: no surrounding space, no hexadecimal
/// (0x1p-1), no inf or nan.
std::optional<double> parse_double(const std::string& text);

/// The first line of a message (errors from TorchScript or c10 carry tracebacks after it).
std::string first_line(const std::string& message);

/// "8GiB", "512MiB", "1.5GB", "1000000B" -> bytes, the unit required and the result a whole number
/// of bytes; throws UsageError otherwise.
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

/// Shell-quotes one argument when it needs it ('blocks.*' stays one word, and no glob expands); one
/// with control characters (a newline, ESC) in bash's $'...' form, so that it stays on one line and
/// writes nothing to a terminal.
std::string shell_quote(const std::string& arg);

/// Text from a model or a user for a terminal, on one line: a newline as \n, other control
/// characters (ESC, which would start a terminal sequence) as \xHH, a tab as a space.
std::string visible(const std::string& text);

}  // namespace ckcheck
