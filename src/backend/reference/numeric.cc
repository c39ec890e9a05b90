// Number formats, activation functions and position-bias math of the reference backend, each
// written from its definition.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numbers>

#include "backend/reference/kernels.h"

namespace kiln::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Rounds a >= 0 (finite) to a float format with `mantissa_bits` stored mantissa bits whose
// smallest normal exponent is `min_exp`: the nearest multiple of the spacing at a's binade,
// ties to even (std::nearbyint in the default rounding mode). The spacing stops shrinking below
// the smallest normal number, which is what makes subnormals.
double round_magnitude(double a, int mantissa_bits, int min_exp) {
  if (a == 0.0 || std::isinf(a)) return a;
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const double spacing = std::ldexp(1.0, std::max(e - 1, min_exp) - mantissa_bits);
  return std::nearbyint(a / spacing) * spacing;
}

}  // namespace

double f16_to_double(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exp = (bits >> 10) & 0x1f, mant = bits & 0x3ff;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * kInf;
  if (exp == 0) return sign * std::ldexp(mant, -24);  // subnormal: mant * 2^-24
  return sign * std::ldexp(1024 + mant, exp - 25);    // (1 + mant / 2^10) * 2^(exp - 15)
}

uint16_t f16_from_double(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7e00;
  const double r = round_magnitude(std::fabs(x), 10, -14);
  if (r >= 65536.0) return sign | 0x7c00;  // past 65504 (ties included) and infinity
  if (r < 0x1p-14) return sign | static_cast<uint16_t>(std::ldexp(r, 24));  // subnormal
  int e = 0;
  std::frexp(r, &e);
  const int exp = e - 1;
  const auto mant = static_cast<uint16_t>(std::ldexp(r, 10 - exp) - 1024.0);
  return sign | static_cast<uint16_t>((exp + 15) << 10) | mant;
}

double bf16_to_double(uint16_t bits) {
  return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(bits) << 16));
}

uint16_t bf16_from_double(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7fc0;
  const double r = round_magnitude(std::fabs(x), 7, -126);
  if (r >= 0x1p128) return sign | 0x7f80;
  // r has at most 8 significant bits, so it is exactly a binary32 whose low half is zero.
  return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(r)) >> 16);
}

namespace {

// The code of r (finite, >= 0, already rounded to the format) in an 8-bit float of
// `mantissa_bits` mantissa bits and exponent bias `bias`, without its sign.
uint8_t f8_magnitude_bits(double r, int mantissa_bits, int bias) {
  const int min_exp = 1 - bias;
  if (r < std::ldexp(1.0, min_exp))  // subnormal: a multiple of 2^(min_exp - mantissa_bits)
    return static_cast<uint8_t>(std::ldexp(r, mantissa_bits - min_exp));
  int e = 0;
  std::frexp(r, &e);
  const int exp = e - 1;
  const int mant = static_cast<int>(std::ldexp(r, mantissa_bits - exp)) - (1 << mantissa_bits);
  return static_cast<uint8_t>(((exp + bias) << mantissa_bits) | mant);
}

}  // namespace

// OCP's E4M3 (no infinities, NaN S.1111.111, bias 7) and E5M2 (IEEE like, bias 15); rounding
// from double saturates E4M3 at ±448 and takes E5M2 past ±57344 to ±inf (core/fp8.h).
double f8_e4m3_to_double(uint8_t bits) {
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  const int exp = (bits >> 3) & 0xf, mant = bits & 0x7;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(mant, -9);  // subnormal: mant * 2^-9
  return sign * std::ldexp(8 + mant, exp - 10);      // (1 + mant / 8) * 2^(exp - 7)
}

uint8_t f8_e4m3_from_double(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7f;
  return sign | f8_magnitude_bits(std::min(round_magnitude(std::fabs(x), 3, -6), 448.0), 3, 7);
}

double f8_e5m2_to_double(uint8_t bits) {
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  const int exp = (bits >> 2) & 0x1f, mant = bits & 0x3;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * kInf;
  if (exp == 0) return sign * std::ldexp(mant, -16);  // subnormal: mant * 2^-16
  return sign * std::ldexp(4 + mant, exp - 17);       // (1 + mant / 4) * 2^(exp - 15)
}

uint8_t f8_e5m2_from_double(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7e;
  const double r = round_magnitude(std::fabs(x), 2, -14);
  if (r >= 65536.0) return sign | 0x7c;  // past 57344 (ties included) and infinity
  return sign | f8_magnitude_bits(r, 2, 15);
}

namespace {

float f32_from_double(double x) {
  // The tie between FLT_MAX and 2^128 rounds to infinity; converting a double beyond the float
  // range is not defined by C++, so the overflow is spelled out.
  if (std::fabs(x) >= 0x1.ffffffp127 && !std::isnan(x))
    return static_cast<float>(std::copysign(kInf, x));
  return static_cast<float>(x);
}

}  // namespace

double element(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return f16_to_double(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return bf16_to_double(static_cast<const uint16_t*>(data)[i]);
    case DType::kI8:
      return static_cast<const int8_t*>(data)[i];
    case DType::kI32:
      return static_cast<const int32_t*>(data)[i];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::kF8E4M3:
      return f8_e4m3_to_double(static_cast<const uint8_t*>(data)[i]);
    case DType::kF8E5M2:
      return f8_e5m2_to_double(static_cast<const uint8_t*>(data)[i]);
    case DType::kI4: {
      const int nibble = (static_cast<const uint8_t*>(data)[i / 2] >> (4 * (i % 2))) & 0xF;
      return nibble >= 8 ? nibble - 16 : nibble;
    }
  }
  KILN_FAIL("reference: unknown dtype {}", static_cast<int>(dtype));
}

int64_t index_element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kI32:
      return t.data<int32_t>()[i];
    case DType::kI64:
      return t.data<int64_t>()[i];
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI4:
      break;
  }
  KILN_FAIL("reference: indices must be i32 or i64, not {}", dtype_name(t.dtype()));
}

void set_element(void* data, DType dtype, int64_t i, double x) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(data)[i] = f32_from_double(x);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(data)[i] = f16_from_double(x);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(data)[i] = bf16_from_double(x);
      return;
    case DType::kF8E4M3:
      static_cast<uint8_t*>(data)[i] = f8_e4m3_from_double(x);
      return;
    case DType::kF8E5M2:
      static_cast<uint8_t*>(data)[i] = f8_e5m2_from_double(x);
      return;
    case DType::kI8:
    case DType::kI32:
    case DType::kI64:
    case DType::kI4:
      break;
  }
  KILN_FAIL("reference kernels write float outputs, not {}", dtype_name(dtype));
}

double round_to(DType dtype, double x) {
  switch (dtype) {
    case DType::kF32:
      return f32_from_double(x);
    case DType::kF16:
      return f16_to_double(f16_from_double(x));
    case DType::kBF16:
      return bf16_to_double(bf16_from_double(x));
    case DType::kF8E4M3:
      return f8_e4m3_to_double(f8_e4m3_from_double(x));
    case DType::kF8E5M2:
      return f8_e5m2_to_double(f8_e5m2_from_double(x));
    case DType::kI8:
    case DType::kI32:
    case DType::kI64:
    case DType::kI4:
      break;
  }
  KILN_FAIL("reference: cannot round to {}", dtype_name(dtype));
}

std::vector<double> load(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = element(t.raw(), t.dtype(), i);
  return v;
}

double activation(Activation act, double x) {
  switch (act) {
    case Activation::kRelu:
      return x > 0.0 ? x : 0.0;
    case Activation::kGeluTanh:
      return 0.5 * x *
             (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    case Activation::kGeluExact:
      return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
    case Activation::kSilu:
      return x / (1.0 + std::exp(-x));
  }
  KILN_FAIL("reference: unknown activation {}", static_cast<int>(act));
}

int t5_bucket(int64_t relative_position, bool bidirectional, int num_buckets, int max_distance) {
  int64_t bucket = 0;
  int64_t n = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (relative_position > 0) bucket = num_buckets;
    n = std::llabs(relative_position);
  } else {
    n = std::max<int64_t>(-relative_position, 0);
  }
  const int max_exact = num_buckets / 2;
  if (n < max_exact) return static_cast<int>(bucket + n);
  // max_exact + (log(n.float() / max_exact) / math.log(max_distance / max_exact)
  //              * (num_buckets - max_exact)).to(long): float32 tensor ops with the Python
  // scalars converted to float32, then truncation.
  const float log_ratio = std::log(static_cast<float>(n) / static_cast<float>(max_exact));
  const auto log_range =
      static_cast<float>(std::log(static_cast<double>(max_distance) / max_exact));
  const float scaled = log_ratio / log_range * static_cast<float>(num_buckets - max_exact);
  const int64_t large =
      std::min<int64_t>(max_exact + static_cast<int64_t>(scaled), num_buckets - 1);
  return static_cast<int>(bucket + large);
}

std::vector<double> alibi_slopes(int num_heads) {
  KILN_CHECK(num_heads > 0, "reference: ALiBi needs at least one head, not {}", num_heads);
  int p = 1;
  while (p * 2 <= num_heads) p *= 2;
  std::vector<double> slopes;
  for (int h = 1; h <= p; ++h) slopes.push_back(std::exp2(-8.0 * h / p));
  for (int i = 0; i < std::min(p, num_heads - p); ++i)
    slopes.push_back(std::exp2(-4.0 * (2 * i + 1) / p));
  return slopes;
}

}  // namespace kiln::reference
