#include "harness/runner/compare.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>

#include "harness/support/errors.h"
#include "harness/support/text.h"

namespace ckcheck {

namespace {

const char* kToleranceForms = "bitwise, auto, rtol=R,atol=A (either may be left out) or ulp=N";

double parse_number(const std::string& text, const std::string& whole) {
  const auto v = parse_double(text);
  if (!v || *v < 0) {
    throw UsageError(fmt::format("tolerance '{}': '{}' is not a non-negative number; valid forms: {}",
                                 whole, text, kToleranceForms));
  }
  return *v;
}

// Bit patterns of a floating tensor as int64, ordered like the values they encode.
torch::Tensor ordered_bits(const torch::Tensor& t) {
  torch::Tensor bits;
  int64_t sign_min = 0;
  switch (t.scalar_type()) {
    case torch::kFloat:
      bits = t.contiguous().view(torch::kInt32).to(torch::kInt64);
      sign_min = std::numeric_limits<int32_t>::min();
      break;
    case torch::kDouble:
      bits = t.contiguous().view(torch::kInt64);
      sign_min = std::numeric_limits<int64_t>::min();
      break;
    case torch::kHalf:
    case torch::kBFloat16:
      bits = t.contiguous().view(torch::kInt16).to(torch::kInt64);
      sign_min = std::numeric_limits<int16_t>::min();
      break;
    default:
      TORCH_CHECK(false, "ulp distance needs a floating tensor, got ", t.scalar_type());
  }
  // Negative values: the magnitude bits count downwards from zero.
  return torch::where(bits < 0, sign_min - bits, bits);
}

}  // namespace

double machine_epsilon(c10::ScalarType dtype) {
  switch (dtype) {
    case torch::kDouble:
      return 2.220446049250313e-16;
    case torch::kFloat:
      return 1.1920928955078125e-07;
    case torch::kHalf:
      return 9.765625e-04;
    case torch::kBFloat16:
      return 7.8125e-03;
    default:
      return 0.0;
  }
}

Tolerance Tolerance::parse(const std::string& text) {
  Tolerance t;
  if (text == "bitwise" || text == "exact") return t;
  if (text == "auto") {
    t.kind = Kind::kAuto;
    return t;
  }
  if (text.rfind("ulp=", 0) == 0) {
    t.kind = Kind::kUlp;
    const double v = parse_number(text.substr(4), text);
    // Float32 values lie at most 2^32 units in the last place apart: a larger bound accepts anything.
    if (v != std::floor(v) || v > 4294967296.0) {
      throw UsageError(fmt::format("tolerance '{}': ulp needs a whole number from 0 to 4294967296; valid forms: {}",
                                   text, kToleranceForms));
    }
    t.ulp = static_cast<int64_t>(v);
    return t;
  }
  t.kind = Kind::kClose;
  bool any = false, seen_rtol = false, seen_atol = false;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto eq = part.find('=');
    const std::string key = part.substr(0, eq);
    if (eq == std::string::npos || (key != "rtol" && key != "atol")) {
      throw UsageError(fmt::format("unknown tolerance '{}'; valid forms: {}", text, kToleranceForms));
    }
    bool& seen = key == "rtol" ? seen_rtol : seen_atol;
    if (seen) {
      throw UsageError(fmt::format("tolerance '{}' gives {} twice; give each of rtol and atol at most once", text, key));
    }
    seen = true;
    (key == "rtol" ? t.rtol : t.atol) = parse_number(part.substr(eq + 1), text);
    any = true;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (!any) throw UsageError(fmt::format("unknown tolerance '{}'; valid forms: {}", text, kToleranceForms));
  return t;
}

std::string Tolerance::text() const {
  switch (kind) {
    case Kind::kBitwise:
      return "bitwise";
    case Kind::kClose:
      return fmt::format("rtol={:g},atol={:g}", rtol, atol);
    case Kind::kUlp:
      return fmt::format("ulp={}", ulp);
    case Kind::kAuto:
      return "auto";
  }
  return "";
}

bool TensorDiff::operator==(const TensorDiff& o) const {
  return name == o.name && kind == o.kind && step == o.step && equal == o.equal &&
         max_abs == o.max_abs && max_rel == o.max_rel && max_ulp == o.max_ulp &&
         mismatched == o.mismatched && first_index == o.first_index &&
         nonfinite_reference == o.nonfinite_reference &&
         nonfinite_checkpointed == o.nonfinite_checkpointed && missing == o.missing &&
         note == o.note && parameter == o.parameter && micro_batch == o.micro_batch;
}

std::ostream& operator<<(std::ostream& os, const TensorDiff& d) {
  os << d.kind << " " << d.name << " (step " << d.step << "): ";
  if (d.missing != "none") return os << "missing on the " << d.missing << " side";
  if (d.equal) return os << "equal";
  os << d.mismatched << "/" << d.numel << " differ, max abs " << d.max_abs << ", max rel "
     << d.max_rel << ", max ulp " << d.max_ulp << ", first at " << d.first_index;
  if (!d.note.empty()) os << " (" << d.note << ")";
  return os;
}

torch::Tensor ulp_distance(const torch::Tensor& a, const torch::Tensor& b) {
  auto da = ordered_bits(a).to(torch::kDouble);
  auto db = ordered_bits(b).to(torch::kDouble);
  return (da - db).abs();
}

uint64_t fingerprint(const torch::Tensor& t) {
  if (!t.defined()) return 0;
  torch::NoGradGuard no_grad;
  auto c = t.detach().to(torch::kCPU).contiguous();
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<uint64_t>(c.scalar_type()));
  for (auto s : c.sizes()) mix(static_cast<uint64_t>(s));
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const size_t n = c.numel() * c.element_size();
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

// Which elements the tolerance accepts; r and g are the flattened values as double.
torch::Tensor accepted(const torch::Tensor& ref, const torch::Tensor& got, const torch::Tensor& r,
                       const torch::Tensor& g, const Tolerance& tol) {
  const auto equal_values = (r == g) | (r.isnan() & g.isnan());
  const auto finite = torch::isfinite(r) & torch::isfinite(g);
  switch (tol.kind) {
    case Tolerance::Kind::kBitwise:
      return equal_values;
    case Tolerance::Kind::kClose:
      return equal_values | (finite & ((r - g).abs() <= tol.atol + tol.rtol * r.abs()));
    case Tolerance::Kind::kUlp:
      if (ref.is_floating_point() && ref.scalar_type() == got.scalar_type()) {
        return equal_values | (finite & (ulp_distance(ref.flatten(), got.flatten()) <= tol.ulp));
      }
      return equal_values;
    case Tolerance::Kind::kAuto:
      if (ref.is_floating_point()) {
        const auto magnitude = torch::where(torch::isfinite(r), r.abs(), torch::zeros_like(r)).max().item<double>();
        const double bound = kAutoEpsilons * machine_epsilon(ref.scalar_type()) * magnitude;
        return equal_values | (finite & ((r - g).abs() <= bound));
      }
      return equal_values;
  }
  return equal_values;
}

// The largest absolute, relative and ULP differences over the elements finite in both.
void measure_distances(const torch::Tensor& ref, const torch::Tensor& got, const torch::Tensor& r,
                       const torch::Tensor& g, TensorDiff& d) {
  const auto finite = torch::isfinite(r) & torch::isfinite(g);
  const auto fdiff = torch::where(finite, (r - g).abs(), torch::zeros_like(r));
  d.max_abs = fdiff.max().item<double>();
  auto rel = fdiff / r.abs().clamp_min(std::numeric_limits<double>::min());
  rel = torch::where(finite & (r != 0), rel, torch::zeros_like(rel));
  d.max_rel = rel.max().item<double>();
  if (ref.is_floating_point() && ref.scalar_type() == got.scalar_type()) {
    auto u = ulp_distance(ref.flatten(), got.flatten());
    u = torch::where(finite, u, torch::zeros_like(u));
    d.max_ulp = static_cast<int64_t>(std::min(u.max().item<double>(), 9.0e18));
  }
}

// Tensors with the same bits (the usual case) are equal under every tolerance, at distance zero:
// said without widening either to double. (+0 and -0, or two NaNs with other payloads, take the
// long way.)
bool bit_identical(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.is_complex()) return false;
  if (!a.is_floating_point()) return torch::equal(a, b);
  const auto size = a.element_size();
  const auto bits = size == 8 ? torch::kInt64 : size == 4 ? torch::kInt32 : size == 2 ? torch::kInt16 : torch::kInt8;
  return torch::equal(a.contiguous().view(bits), b.contiguous().view(bits));
}

// The NaN and inf elements of a floating-point tensor (0 for others). One sum settles the common
// case: a NaN or inf term makes any sum NaN or inf, so a finite sum has none; a sum that is not
// finite (a NaN, or finite terms that overflowed) has them counted.
int64_t nonfinite_count(const torch::Tensor& t) {
  if (!t.is_floating_point() || t.numel() == 0) return 0;
  if (std::isfinite(t.sum().item<double>())) return 0;
  return (~torch::isfinite(t)).sum().item<int64_t>();
}

}  // namespace

TensorDiff compare_tensors(const torch::Tensor& reference, const torch::Tensor& checkpointed,
                           const Tolerance& tol) {
  torch::NoGradGuard no_grad;
  TensorDiff d;
  if (!reference.defined() || !checkpointed.defined()) {
    if (reference.defined() != checkpointed.defined()) {
      d.equal = false;
      d.missing = reference.defined() ? "checkpointed" : "reference";
      d.numel = reference.defined() ? reference.numel() : checkpointed.numel();
    }
    return d;
  }
  auto ref = reference.detach().to(torch::kCPU);
  auto got = checkpointed.detach().to(torch::kCPU);
  d.numel = ref.numel();
  d.nonfinite_reference = nonfinite_count(ref);
  const bool same_dtype = ref.scalar_type() == got.scalar_type();
  if (same_dtype && ref.sizes() == got.sizes() && d.numel > 0 && bit_identical(ref, got)) {
    d.nonfinite_checkpointed = d.nonfinite_reference;  // the same bits: the same NaNs and infs
    return d;
  }
  d.nonfinite_checkpointed = nonfinite_count(got);
  if (ref.sizes() != got.sizes()) {
    d.equal = false;
    d.mismatched = std::max(ref.numel(), got.numel());
    d.note = fmt::format("shape {} vs {}", fmt::join(ref.sizes(), "x"), fmt::join(got.sizes(), "x"));
    return d;
  }
  if (!same_dtype) {
    d.note = fmt::format("dtype {} vs {}", c10::toString(ref.scalar_type()),
                         c10::toString(got.scalar_type()));
  }
  if (d.numel == 0) {
    d.equal = same_dtype || !tol.bitwise();
    return d;
  }
  const auto r = ref.to(torch::kDouble).flatten();
  const auto g = got.to(torch::kDouble).flatten();
  measure_distances(ref, got, r, g, d);
  const auto bad = ~accepted(ref, got, r, g, tol);
  d.mismatched = bad.sum().item<int64_t>();
  if (d.mismatched > 0) d.first_index = bad.nonzero()[0][0].item<int64_t>();
  // A dtype change is a difference in its own right under bitwise comparison.
  d.equal = d.mismatched == 0 && (same_dtype || !tol.bitwise());
  return d;
}

}  // namespace ckcheck
