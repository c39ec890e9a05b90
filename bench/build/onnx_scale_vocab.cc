// Copies the fixture BLOOM export with its vocabulary scaled to V rows (embedding [V, 32],
// lm_head [32, V], random values): a memory test of `kiln build --onnx` at size.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include "onnx.pb.h"
int main(int argc, char** argv) {
  std::ifstream in(argv[1], std::ios::binary);
  onnx::ModelProto m;
  if (!m.ParseFromIstream(&in)) return 1;
  const int64_t v = std::atoll(argv[2]);
  auto fill = [](onnx::TensorProto* t, int64_t rows, int64_t cols) {
    t->clear_dims();
    t->add_dims(rows);
    t->add_dims(cols);
    std::string bytes(static_cast<size_t>(rows * cols * 4), '\0');
    float* f = reinterpret_cast<float*>(bytes.data());
    uint32_t s = 1;
    for (int64_t i = 0; i < rows * cols; ++i) {
      s = s * 1664525u + 1013904223u;
      f[i] = (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
    t->set_raw_data(std::move(bytes));
  };
  std::string last_matmul;
  for (auto& t : *m.mutable_graph()->mutable_initializer()) {
    if (t.name() == "m.transformer.word_embeddings.weight") fill(&t, v, 32);
    if (t.name().rfind("onnx::MatMul_", 0) == 0) last_matmul = t.name();
  }
  for (auto& t : *m.mutable_graph()->mutable_initializer())
    if (t.name() == last_matmul) fill(&t, 32, v);
  for (auto& o : *m.mutable_graph()->mutable_output()) {
    auto* shape = o.mutable_type()->mutable_tensor_type()->mutable_shape();
    auto* d = shape->mutable_dim(shape->dim_size() - 1);
    if (d->has_dim_value() && d->dim_value() == 96) d->set_dim_value(v);
  }
  std::ofstream out(argv[3], std::ios::binary);
  return m.SerializeToOstream(&out) ? 0 : 1;
}
