// Kernels are objects created once per node when a graph is compiled, from one registry keyed by
// (op, dtypes, device, ISA): this is the single dispatch point of every backend. A kernel may
// prepare() state once (pack weights, create library primitives), says how much scratch memory
// it needs for a shape bucket, and run()s each step on tensors that already live in the
// executable's workspace.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/step.h"
#include "core/target.h"
#include "core/thread_pool.h"
#include "graph/ir.h"
#include "graph/linear.h"

namespace kiln {

// Kernel families. kReference is the oracle (plain loops, double accumulation where it
// matters); kAvx2 is the CPU baseline (x86-64-v3); kAvx512 needs AVX-512F at run time.
// kAvx512Bf16: the AVX-512 kernels, with AVX512-BF16 dot products where a kernel has them.
// kAvx512Vnni: the AVX-512 kernels, with AVX512-VNNI int8 dot products for i8-weight Linears.
enum class Isa : uint8_t { kReference, kAvx2, kAvx512, kAvx512Bf16, kAvx512Vnni, kSm90 };
std::string_view isa_name(Isa isa);

struct KernelKey {
  OpKind op;
  DType act;     // dtype of the node's first output
  DType weight;  // dtype of its first weight input (== act when it has none)
  Device device;
  Isa isa;
  auto operator<=>(const KernelKey&) const = default;
};
// The key a node asks for on a device and ISA.
KernelKey kernel_key(const Graph& graph, const Node& node, Device device, Isa isa);
std::string describe_key(const KernelKey& key);

using Bindings = std::map<std::string, int64_t>;

struct KernelArgs {
  std::span<const Tensor> in;         // in the order the op's schema documents; undefined = absent
  std::span<Tensor> out;              // preallocated, of the inferred shapes
  void* scratch = nullptr;            // workspace_bytes() of device memory, 64-byte aligned
  const StepContext* step = nullptr;  // required by Attention
  ThreadPool* pool = nullptr;         // CPU kernels
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Once per node at compile time, before any run().
  virtual void prepare(const Graph& graph) {}
  // Scratch bytes a run needs at these (bucket) bindings.
  virtual int64_t workspace_bytes(const Bindings& bindings) const { return 0; }
  virtual void run(const KernelArgs& args) = 0;
};

using KernelFactory = std::function<std::unique_ptr<Kernel>(const Node& node)>;

// Kernels by key, each entry stating the fused extras (graph/linear.h) it implements: a node is
// run by the first entry of its key (registration order, then the ISA fallback) that implements
// every extra the node has, and a backend's refusal is derived from the same match.
class KernelRegistry {
 public:
  // `name` says what the kernel is in logs and `kiln inspect` ("avx512 dot4 linear"); `extras`
  // what it implements beyond the plain op (a node with any other extra is not given to it).
  void add(const KernelKey& key, std::string name, KernelFactory factory, ExtraSet extras = {});

  struct Entry {
    std::string name;
    KernelFactory factory;
    ExtraSet extras;
  };
  // The first entry of the key that implements `needed`, or for a CPU ISA of the next narrower
  // family that has one (AVX512-BF16 / VNNI → AVX-512 → AVX2). Null when nothing fits.
  const Entry* find(const KernelKey& key, ExtraSet needed) const;
  // Empty when find(key, needed) has an entry; otherwise why not, from the entries themselves:
  // "no <backend> kernel for <key>", or the extras of `needed` that the key's kernels lack,
  // named, with what they do implement.
  std::string unsupported_reason(const KernelKey& key, ExtraSet needed,
                                 std::string_view backend) const;
  std::vector<KernelKey> keys() const;

 private:
  // Each key's entries in registration order.
  std::map<KernelKey, std::vector<Entry>> entries_;
};

// Adapts a plain function to a stateless kernel.
using KernelFn = void (*)(const Node& node, const KernelArgs& args);
KernelFactory function_kernel(KernelFn fn);

}  // namespace kiln
