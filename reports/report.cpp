#include "reports/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "checks/common.h"
#include "ckcheck/version.h"
#include "harness/support/errors.h"


namespace ckcheck {

std::string ckcheck_version() { return CKCHECK_VERSION; }

BuildInfo build_info() {
  BuildInfo b;
  b.ckcheck = CKCHECK_VERSION;
  b.libtorch = CKCHECK_LIBTORCH_VERSION;
  b.cuda_version = CKCHECK_CUDA_VERSION;
  b.cuda = !b.cuda_version.empty();
  return b;
}

std::string version_text() {
  const auto b = build_info();
  return fmt::format("ckcheck {}\nbuilt against LibTorch {}; CUDA support {}", b.ckcheck, b.libtorch,
                     b.cuda ? "compiled in (CUDA " + b.cuda_version + ")" : "not compiled in (CPU only)");
}

const std::vector<std::string>& report_formats() {
  static const std::vector<std::string> formats = {"console", "json", "junit", "markdown", "html", "baseline"};
  return formats;
}

namespace {

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// A report into a file that does not exist yet: its folder must take it.
ReportTarget new_file_target(ReportTarget t, const std::string& text, const std::string& path) {
  const auto dir = folder_of(path);
  if (access(dir.c_str(), W_OK) != 0) {
    throw FieldError("report", fmt::format("@report {}: cannot write into folder '{}' ({}); create it or "
                                           "choose another path",
                                           text, dir, std::strerror(errno)));
  }
  // Its folder resolved, so that two spellings of one new file are one path.
  char folder[PATH_MAX];
  t.path = realpath(dir.c_str(), folder) ? std::string(folder) + "/" + path.substr(path.find_last_of('/') + 1) : path;
  t.sink = ReportTarget::Sink::kFile;
  return t;
}

}  // namespace

ReportTarget parse_report_target(const std::string& text) {
  ReportTarget t;
  t.given = text;
  const auto eq = text.find('=');
  t.format = text.substr(0, eq);
  const std::string path = eq == std::string::npos ? "" : text.substr(eq + 1);
  const auto& formats = report_formats();
  if (std::find(formats.begin(), formats.end(), t.format) == formats.end()) {
    throw FieldError("report", fmt::format("unknown report format '{}' in @report {}; formats: {} (as "
                                           "FORMAT or FORMAT=PATH)",
                                           t.format, text, fmt::join(formats, ", ")));
  }
  if (eq == std::string::npos || path == "-") return t;
  if (path.empty() || path.back() == '/') {
    throw FieldError("report", fmt::format("@report {}: give a file path after '=' ('-' for standard output)", text));
  }
  struct stat link_st, st, out_st;
  if (lstat(path.c_str(), &link_st) != 0) return new_file_target(t, text, path);
  if (stat(path.c_str(), &st) == 0 && fstat(STDOUT_FILENO, &out_st) == 0 && st.st_dev == out_st.st_dev &&
      st.st_ino == out_st.st_ino) {
    return t;  // /dev/stdout, /dev/fd/1, or the file standard output goes to: standard output
  }
  if (stat(path.c_str(), &st) != 0) {
    throw FieldError("report", fmt::format("@report {}: '{}' is a symlink to a missing file ({}); remove it or choose another path",
                                           text, path, std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    throw FieldError("report", fmt::format("@report {}: '{}' is a folder; give a file path inside it", text, path));
  }
  if (access(path.c_str(), W_OK) != 0) {
    throw FieldError("report", fmt::format("@report {}: '{}' exists and is not writable ({})", text, path, std::strerror(errno)));
  }
  if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
    t.path = path;
    t.sink = ReportTarget::Sink::kStream;
    return t;
  }
  if (!S_ISREG(st.st_mode)) {
    throw FieldError("report", fmt::format("@report {}: '{}' is not a regular file, a character device or a pipe; choose a file path",
                                           text, path));
  }
  // A regular file, maybe through symlinks: replace the file they name, keep the links.
  char resolved[PATH_MAX];
  if (!realpath(path.c_str(), resolved)) {
    throw FieldError("report", fmt::format("@report {}: cannot resolve '{}' ({})", text, path, std::strerror(errno)));
  }
  t.path = resolved;
  const auto dir = folder_of(t.path);
  if (access(dir.c_str(), W_OK) != 0) {
    throw FieldError("report", fmt::format("@report {}: cannot write into folder '{}' ({}), where the report is replaced "
                                           "atomically; choose another path",
                                           text, dir, std::strerror(errno)));
  }
  t.sink = ReportTarget::Sink::kFile;
  return t;
}

namespace {

std::string temporary_beside(const std::string& path, size_t i) {
  return fmt::format("{}/.{}.ckcheck-{}-{}.tmp", folder_of(path), path.substr(path.find_last_of('/') + 1), getpid(), i);
}

void write_text(const std::string& path, const std::string& text, std::ios::openmode mode, const ReportTarget& t) {
  std::ofstream out(path, std::ios::binary | mode);
  out << text;
  out.flush();
  if (!out) {
    throw FieldError("report", fmt::format("@report {}: could not write '{}' ({}); no report file was changed", t.given,
                                           t.path, std::strerror(errno ? errno : EIO)));
  }
}

// A device or pipe, opened without blocking: a pipe with no reader is an error, not a hang.
int open_stream(const ReportTarget& t) {
  const int fd = ::open(t.path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    throw FieldError("report", fmt::format("@report {}: cannot open '{}' ({}){}", t.given, t.path, std::strerror(errno),
                                           errno == ENXIO ? ": a pipe with no reader" : ""));
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void write_stream(int fd, const std::string& text, const ReportTarget& t) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw FieldError("report", fmt::format("@report {}: could not write '{}' ({})", t.given, t.path, std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
}

// A file target as it stands now: still a file (or absent) in a folder ckcheck can write to; the
// mode and owner of the file it replaces go to the new one.
void ready_to_replace(const ReportTarget& t, const std::string& tmp) {
  struct stat st;
  if (lstat(t.path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      throw FieldError("report", fmt::format("@report {}: '{}' is no longer a regular file; no report file was changed",
                                             t.given, t.path));
    }
    chmod(tmp.c_str(), st.st_mode & 07777);
    [[maybe_unused]] const int owned = chown(tmp.c_str(), st.st_uid, st.st_gid);  // as root; else it stays ours
  } else if (access(folder_of(t.path).c_str(), W_OK) != 0) {
    throw FieldError("report", fmt::format("@report {}: cannot write into '{}' any more ({}); no report file was changed",
                                           t.given, folder_of(t.path), std::strerror(errno)));
  }
}

}  // namespace

void write_reports(const Report& report, const std::vector<ReportTarget>& targets,
                   std::ostream& stdout_stream, bool color) {
  std::vector<std::string> texts;
  for (const auto& t : targets) {
    std::unique_ptr<Reporter> reporter;
    if (t.format == "console") reporter = make_console_reporter(color && t.sink == ReportTarget::Sink::kStdout);
    if (t.format == "json") reporter = make_json_reporter();
    if (t.format == "junit") reporter = make_junit_reporter();
    if (t.format == "markdown") reporter = make_markdown_reporter();
    if (t.format == "html") reporter = make_html_reporter();
    if (t.format == "baseline") reporter = make_baseline_reporter();
    std::ostringstream s;
    reporter->write(report, s);
    texts.push_back(s.str());
  }
  // All or none: every file to a temporary file beside it, every target checked again as it stands
  // now and every device or pipe opened, before anything is replaced or written through.
  std::vector<std::pair<std::string, std::string>> renames;
  std::vector<std::pair<int, size_t>> streams;
  try {
    for (size_t i = 0; i < targets.size(); ++i) {
      const auto& t = targets[i];
      if (t.sink == ReportTarget::Sink::kFile) {
        renames.push_back({temporary_beside(t.path, i), t.path});
        write_text(renames.back().first, texts[i], std::ios::trunc, t);
        ready_to_replace(t, renames.back().first);
      } else if (t.sink == ReportTarget::Sink::kStream) {
        streams.push_back({open_stream(t), i});
      }
    }
    for (const auto& [fd, i] : streams) write_stream(fd, texts[i], targets[i]);
    for (const auto& [tmp, path] : renames) {
      if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        throw UsageError(fmt::format("could not write report file '{}': {}", path, std::strerror(errno)));
      }
    }
  } catch (...) {
    for (const auto& [fd, i] : streams) close(fd);
    for (const auto& [tmp, path] : renames) std::remove(tmp.c_str());
    throw;
  }
  for (const auto& [fd, i] : streams) close(fd);
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].sink != ReportTarget::Sink::kStdout) continue;
    stdout_stream << texts[i];
    stdout_stream.flush();
  }
}

std::string escape_markup(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\n' || c == '\t') out += c;
    }
  }
  return out;
}

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return "0";
  return fmt::format("{:.3g}", v);
}

}  // namespace ckcheck
