#include "backend/cpu/onednn_reference.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "core/status.h"

namespace kiln::cpu {
namespace {

// Every element of `m` set to a small non-zero value (0.01 in f32 or bf16, 3 in 8-bit types).
void fill(const dnnl::memory& m, LibraryGemmType type) {
  const size_t bytes = m.get_desc().get_size();
  if (type == LibraryGemmType::kBf16) {
    auto* p = static_cast<uint16_t*>(m.get_data_handle());
    std::fill(p, p + bytes / 2, uint16_t{0x3C24});
  } else if (type == LibraryGemmType::kInt8) {
    std::memset(m.get_data_handle(), 3, bytes);
  } else {
    auto* p = static_cast<float*>(m.get_data_handle());
    std::fill(p, p + bytes / 4, 0.01f);
  }
}

}  // namespace

std::optional<LibraryGemmTiming> time_onednn_matmul(int64_t rows, int64_t in, int64_t out,
                                                    LibraryGemmType type, int threads, int runs) {
  KILN_CHECK(rows > 0 && in > 0 && out > 0 && threads > 0 && runs > 0,
             "oneDNN reference GEMM: rows {}, in {}, out {}, {} threads, {} runs", rows, in, out,
             threads, runs);
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const int saved_threads = omp_get_max_threads();
  try {
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    const dt x_type = type == LibraryGemmType::kBf16   ? dt::bf16
                      : type == LibraryGemmType::kInt8 ? dt::u8
                                                       : dt::f32;
    const dt w_type = type == LibraryGemmType::kInt8 ? dt::s8 : x_type;
    const dnnl::memory::desc x_desc({rows, in}, x_type, tag::ab);
    const dnnl::memory::desc y_desc({rows, out}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(x_desc, dnnl::memory::desc({in, out}, w_type, tag::any), y_desc),
        engine);
    omp_set_num_threads(threads);
    // The weights as kiln's plain plans hold them (w [out, in] row-major: [in, out] with the
    // input dimension innermost), reordered once into oneDNN's layout.
    dnnl::memory plain({{in, out}, w_type, tag::ba}, engine);
    fill(plain, type);
    dnnl::memory w(pd.weights_desc(), engine);
    dnnl::reorder(plain, w).execute(stream, plain, w);
    dnnl::memory x(x_desc, engine), y(y_desc, engine);
    fill(x, type);
    const dnnl::matmul matmul(pd);
    auto run = [&] {
      matmul.execute(stream, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}});
      stream.wait();
    };
    run();  // page faults, caches, oneDNN's own first-call work
    std::vector<double> ms;
    for (int i = 0; i < runs; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    omp_set_num_threads(saved_threads);
    std::sort(ms.begin(), ms.end());
    return LibraryGemmTiming{ms[ms.size() / 2], pd.impl_info_str()};
  } catch (const dnnl::error& e) {
    omp_set_num_threads(saved_threads);
    if (e.status == dnnl_unimplemented) return std::nullopt;
    KILN_CHECK(false, "oneDNN reference GEMM [{} x {}] · [{} x {}]ᵀ ({}) failed: {} (status {})",
               rows, in, out, in, library_gemm_type_name(type), e.what(),
               static_cast<int>(e.status));
  }
  return {};
}

}  // namespace kiln::cpu
