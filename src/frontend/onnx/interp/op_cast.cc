// Cast (opsets 13-18): between every type the interpreter holds, and from float types to double
// (held as float). Floats become integers by
// truncation (float_to_int: no undefined behaviour for NaN or out-of-range values), integers
// narrow modulo 2^bits, anything becomes bool as "!= 0", and float16/bfloat16 round to nearest
// even. The opset-19 `saturate` attribute concerns float8 types, which the interpreter has not.
#include "core/half.h"
#include "frontend/onnx/interp/kernel_util.h"
#include "frontend/onnx/interp/kernels.h"

namespace kiln {
namespace {

template <typename V>
void store(const std::vector<V>& src, ImportTensor& y) {
  const size_t n = src.size();
  switch (y.type()) {
    case OnnxElemType::kFloat: {
      float* dst = y.mutable_data<float>();
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
      return;
    }
    case OnnxElemType::kFloat16: {
      uint16_t* dst = y.mutable_data<uint16_t>();
      for (size_t i = 0; i < n; ++i) dst[i] = float_to_fp16(static_cast<float>(src[i]));
      return;
    }
    case OnnxElemType::kBFloat16: {
      uint16_t* dst = y.mutable_data<uint16_t>();
      for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(static_cast<float>(src[i]));
      return;
    }
    case OnnxElemType::kBool: {
      uint8_t* dst = y.mutable_data<uint8_t>();
      for (size_t i = 0; i < n; ++i) dst[i] = src[i] != V{0};
      return;
    }
    case OnnxElemType::kInt64:
    case OnnxElemType::kInt32:
    case OnnxElemType::kInt8:
    case OnnxElemType::kUint8:
      visit_numeric(y.type(), "Cast", [&](auto tag) {
        using T = decltype(tag);
        T* dst = y.mutable_data<T>();
        for (size_t i = 0; i < n; ++i) {
          if constexpr (std::is_floating_point_v<V>)
            dst[i] = float_to_int<T>(src[i]);
          else
            dst[i] = static_cast<T>(src[i]);  // modulo 2^bits (C++20)
        }
      });
      return;
    case OnnxElemType::kUndefined:
    case OnnxElemType::kUint16:
    case OnnxElemType::kInt16:
    case OnnxElemType::kString:
    case OnnxElemType::kDouble:
    case OnnxElemType::kUint32:
    case OnnxElemType::kUint64:
    case OnnxElemType::kComplex64:
    case OnnxElemType::kComplex128:
      break;
  }
  KILN_FAIL("Cast to {} is not supported", onnx_elem_type_name(y.type()));
}

}  // namespace

void run_cast(OpContext& ctx) {
  const OnnxAttribute* to = ctx.attr("to", OnnxAttrKind::kInt);
  KILN_CHECK(to != nullptr, "Cast needs the attribute 'to'");
  auto type = static_cast<OnnxElemType>(to->i);
  const OnnxElemType from = ctx.input_type(0);
  // The interpreter holds no double tensors. A float, float16 or bfloat16 widened to double is
  // exactly a float, which is what it holds (HF T5's fp16 overflow test casts its activations
  // to double for IsInf); double from an integer could lose digits and is refused.
  if (type == OnnxElemType::kDouble) {
    KILN_CHECK(is_float_type(from),
               "Cast to double is taken from float, float16 or bfloat16 only (held as float, "
               "exactly), not from {}",
               onnx_elem_type_name(from));
    type = OnnxElemType::kFloat;
  }
  check_interpreter_type(type, "Cast's target type");
  if (ctx.shape_only()) {
    ctx.set_output(0, type, ctx.input_shape(0));
    return;
  }
  const ImportTensor& x = ctx.input(0);
  if (from == type) {  // a view, nothing to convert
    ctx.set_output(0, x);
    return;
  }
  ImportTensor& y = ctx.set_output(0, type, x.shape());
  if (is_float_type(from))
    store(x.to_floats(), y);
  else
    store(x.to_int64s(), y);
}

}  // namespace kiln
