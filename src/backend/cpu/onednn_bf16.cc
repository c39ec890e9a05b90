#include "backend/cpu/onednn_bf16.h"

#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/status.h"

namespace kiln::cpu {
namespace {

dnnl::matmul::primitive_desc matmul_desc(const dnnl::engine& engine, int64_t m, int64_t k,
                                         int64_t n, int64_t ldy) {
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc a({m, k}, dt::bf16, dnnl::memory::dims{k, 1});
  const dnnl::memory::desc w({k, n}, dt::bf16, dnnl::memory::dims{1, k});  // w [n, k] as [k, n]
  const dnnl::memory::desc y({m, n}, dt::f32, dnnl::memory::dims{ldy, 1});
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, w, y), engine);
}

}  // namespace

const std::string& onednn_bf16_matmul_impl() {
  static const std::string impl = [] {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      std::string name = matmul_desc(engine, 128, 1024, 1024, 1024).impl_info_str();
      return name.find("ref") == std::string::npos ? name : std::string();
    } catch (const dnnl::error&) {
      return std::string();
    }
  }();
  return impl;
}

void onednn_matmul_bf16(const uint16_t* a, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                        float* y, int64_t ldy) {
  try {
    // Primitives for a shape seen before come from oneDNN's primitive cache.
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    const auto pd = matmul_desc(engine, m, k, n, ldy);
    dnnl::memory am(pd.src_desc(), engine, const_cast<uint16_t*>(a));
    dnnl::memory wm(pd.weights_desc(), engine, const_cast<uint16_t*>(w));
    dnnl::memory ym(pd.dst_desc(), engine, y);
    dnnl::stream stream(engine);
    omp_set_num_threads(1);
    dnnl::matmul(pd).execute(stream,
                             {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
    stream.wait();
  } catch (const dnnl::error& e) {
    KILN_CHECK(false, "oneDNN bf16 matmul [{} x {}] · [{} x {}]ᵀ failed: {} (status {})", m, k, n,
               k, e.what(), static_cast<int>(e.status));
  }
}

}  // namespace kiln::cpu
