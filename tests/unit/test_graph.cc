// The graph IR: builder shape inference and rejection, the verifier's invariants, the text dump,
// JSON round trips and malformed JSON (as a corrupt plan would hold).
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "graph/builder.h"
#include "graph/op_registry.h"
#include "graph/serialize.h"
#include "graph/verifier.h"
#include "passes/pass.h"

namespace kiln {
namespace {

const Dim kTokens = Dim::sym("tokens");

Tensor weight_data(Shape shape, float seed = 0.5f) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = seed + 0.01f * static_cast<float>(i);
  return t;
}

// The message of the kiln::Error `f` throws; a test failure when it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a kiln::Error";
  return {};
}

SymShape tokens_by(int64_t d) { return {kTokens, Dim::of(d)}; }

AttentionAttrs attn_attrs(AttentionKind kind, int heads, int head_dim) {
  AttentionAttrs a;
  a.kind = kind;
  a.num_heads = heads;
  a.head_dim = head_dim;
  return a;
}

TEST(GraphBuilder, SymbolicDimsFlowThroughShapeInference) {
  GraphBuilder b("g");
  const int ids = b.input("ids", DType::kI64, {kTokens});
  const int x = b.embedding(b.weight("table", weight_data({100, 16})), ids, "embed");
  const int h =
      b.linear(x, b.weight("w", weight_data({32, 16})), b.weight("b", weight_data({32})), "proj");
  const int n = b.rms_norm(h, b.weight("norm.w", weight_data({32})), 1e-6, "norm");
  const int s = b.add(h, n, "residual");
  const int act = b.gated_activation(s, n, Activation::kGeluTanh, "gated");
  const int rows = b.gather_rows(act, b.input("rows", DType::kI64, {Dim::sym("rows")}), "gather");
  const int half = b.cast(rows, DType::kF16, "to_f16");
  const int q = b.linear(x, b.weight("wq", weight_data({12, 16})), -1, "q");
  const int self = b.attention(q, q, q, -1, attn_attrs(AttentionKind::kEncoderSelf, 3, 4), "self");
  const int qkv = b.linear(x, b.weight("wqkv", weight_data({36, 16})), -1, "qkv");
  AttentionAttrs packed = attn_attrs(AttentionKind::kCachedSelf, 3, 4);
  packed.packed_qkv = true;
  const int cached = b.attention(qkv, -1, -1, -1, packed, "cached");
  const int cross = b.attention(q, -1, -1, -1, attn_attrs(AttentionKind::kCross, 3, 4), "cross");
  const Graph& g = b.graph();
  EXPECT_EQ(g.values[x].shape, tokens_by(16));
  EXPECT_EQ(g.values[h].shape, tokens_by(32)) << "[tokens, 16] x [32, 16] -> [tokens, 32]";
  for (int id : {n, s, act}) EXPECT_EQ(g.values[id].shape, tokens_by(32)) << g.values[id].name;
  EXPECT_EQ(g.values[rows].shape, (SymShape{Dim::sym("rows"), Dim::of(32)}));
  EXPECT_EQ(g.values[half].dtype, DType::kF16);
  EXPECT_EQ(g.values[half].shape, g.values[rows].shape);
  EXPECT_EQ(g.values[qkv].shape, tokens_by(36));
  for (int id : {self, cached, cross}) EXPECT_EQ(g.values[id].shape, tokens_by(12));
  EXPECT_EQ(g.values[h].producer, 1);
  EXPECT_EQ(g.values[h].kind, ValueKind::kActivation);
  EXPECT_EQ(g.values[h].name, "proj");
  // The fused residual op (made by a pass, not the builder) infers two outputs.
  Node fused{OpKind::kAddRmsNorm, "fused", {h, n, g.find_value("norm.w")}, {}, NormAttrs{1e-6}};
  const std::vector<ValueType> types = infer_node(g, fused);
  ASSERT_EQ(types.size(), 2u);
  EXPECT_EQ(types[0].shape, tokens_by(32));
  EXPECT_EQ(types[1].shape, tokens_by(32));
}

TEST(GraphBuilder, LinearAcceptsRank3AndKeepsLeadingDims) {
  GraphBuilder b("g");
  const int x = b.input("x", DType::kF32, {Dim::sym("batch"), kTokens, Dim::of(8)});
  const int y = b.linear(x, b.weight("w", weight_data({4, 8})), -1, "fc");
  EXPECT_EQ(b.graph().values[y].shape, (SymShape{Dim::sym("batch"), kTokens, Dim::of(4)}));
}

struct Rejection {
  const char* node;
  std::function<void(GraphBuilder&, int x16, int x32)> add;
};

TEST(BadInputGraphBuilder, MismatchedShapesNameTheNode) {
  const Rejection cases[] = {
      {"proj",
       [](GraphBuilder& b, int x, int) {
         b.linear(x, b.weight("w", weight_data({32, 8})), -1, "proj");
       }},
      {"proj_bias",
       [](GraphBuilder& b, int x, int) {
         b.linear(x, b.weight("w", weight_data({32, 16})), b.weight("bias", weight_data({31})),
                  "proj_bias");
       }},
      {"residual", [](GraphBuilder& b, int x, int y) { b.add(x, y, "residual"); }},
      {"product", [](GraphBuilder& b, int x, int y) { b.mul(y, x, "product"); }},
      {"norm", [](GraphBuilder& b, int x,
                  int) { b.rms_norm(x, b.weight("nw", weight_data({8})), 1e-6, "norm"); }},
      {"ln",
       [](GraphBuilder& b, int x, int) {
         b.layer_norm(x, b.weight("lw", weight_data({16})), b.weight("lb", weight_data({15})), 1e-5,
                      "ln");
       }},
      {"gated",
       [](GraphBuilder& b, int x, int y) { b.gated_activation(x, y, Activation::kSilu, "gated"); }},
      {"gated_packed_odd",  // one packed gate | up input needs an even width
       [](GraphBuilder& b, int, int) {
         b.gated_activation(b.input("odd", DType::kF32, tokens_by(15)), -1, Activation::kSilu,
                            "gated_packed_odd");
       }},
      {"embed",
       [](GraphBuilder& b, int x, int) {
         b.embedding(b.weight("t", weight_data({10, 4})), x, "embed");
       }},
      {"gather",
       [](GraphBuilder& b, int x, int) {
         b.gather_rows(x, b.input("rows32", DType::kI32, {Dim::sym("rows")}), "gather");
       }},
      {"attn_width",
       [](GraphBuilder& b, int x, int) {
         b.attention(x, x, x, -1, attn_attrs(AttentionKind::kEncoderSelf, 4, 3), "attn_width");
       }},
      {"attn_kv",
       [](GraphBuilder& b, int x, int y) {
         b.attention(x, y, x, -1, attn_attrs(AttentionKind::kEncoderSelf, 4, 4), "attn_kv");
       }},
      {"attn_table",
       [](GraphBuilder& b, int x, int) {
         AttentionAttrs a = attn_attrs(AttentionKind::kEncoderSelf, 4, 4);
         a.bias = PositionBias::kT5Relative;  // 32 buckets, but the table has 16 rows
         b.attention(x, x, x, b.weight("rel", weight_data({16, 4})), a, "attn_table");
       }},
      {"attn_packed_cross",
       [](GraphBuilder& b, int, int y) {
         AttentionAttrs a = attn_attrs(AttentionKind::kCross, 2, 16);
         a.packed_qkv = true;
         b.attention(y, -1, -1, -1, a, "attn_packed_cross");
       }},
      {"act_on_ints",
       [](GraphBuilder& b, int, int) {
         b.activation(b.input("ints", DType::kI64, {kTokens}), Activation::kRelu, "act_on_ints");
       }},
  };
  for (const Rejection& c : cases) {
    GraphBuilder b("g");
    const int x16 = b.input("x16", DType::kF32, tokens_by(16));
    const int x32 = b.input("x32", DType::kF32, tokens_by(32));
    const std::string msg = error_of([&] { c.add(b, x16, x32); });
    EXPECT_NE(msg.find(c.node), std::string::npos) << c.node << ": " << msg;
    EXPECT_TRUE(b.graph().nodes.empty()) << c.node << ": a rejected node must not be added";
  }
}

TEST(BadInputGraphBuilder, DuplicateNamesAndBadOutputs) {
  GraphBuilder b("g");
  const int x = b.input("x", DType::kF32, tokens_by(4));
  EXPECT_THROW(b.input("x", DType::kF32, tokens_by(4)), Error);
  EXPECT_THROW(b.weight("x", weight_data({4})), Error);
  EXPECT_THROW(b.output(99, "y"), Error);
  const int y = b.scale(x, 2.0f, "twice");
  EXPECT_THROW(b.output(y, "x"), Error) << "output name taken by another value";
}

// ---- verifier -------------------------------------------------------------------------------

// x -> Linear -> RMSNorm -> Scale, output "y".
Graph small_graph() {
  GraphBuilder b("small");
  const int x = b.input("x", DType::kF32, tokens_by(16));
  const int h = b.linear(x, b.weight("w", weight_data({32, 16})), -1, "proj");
  const int n = b.rms_norm(h, b.weight("norm.w", weight_data({32})), 1e-6, "norm");
  b.output(b.scale(n, 0.5f, "scale"), "y");
  return b.finish();
}

TEST(GraphVerify, AcceptsBuiltGraph) { EXPECT_NO_THROW(verify_graph(small_graph())); }

TEST(GraphVerify, CatchesUseBeforeDefinition) {
  Graph g = small_graph();
  std::swap(g.nodes[0], g.nodes[1]);  // the norm now runs before the Linear it reads
  const std::string msg = error_of([&] { verify_graph(g); });
  EXPECT_NE(msg.find("before it is produced"), std::string::npos) << msg;
  EXPECT_NE(msg.find("norm"), std::string::npos) << msg;
}

TEST(GraphVerify, CatchesDuplicateValueNames) {
  Graph g = small_graph();
  g.values[g.find_value("norm")].name = "proj";
  const std::string msg = error_of([&] { verify_graph(g); });
  EXPECT_NE(msg.find("duplicate value name 'proj'"), std::string::npos) << msg;
}

TEST(GraphVerify, CatchesWeightDataMismatch) {
  {
    Graph g = small_graph();
    g.values[g.find_value("w")].shape = {Dim::of(32), Dim::of(8)};
    const std::string msg = error_of([&] { verify_graph(g); });
    EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  }
  {
    Graph g = small_graph();
    g.values[g.find_value("norm.w")].dtype = DType::kF16;
    EXPECT_THROW(verify_graph(g), Error) << "declared dtype differs from the data's";
  }
  {
    Graph g = small_graph();
    g.values[g.find_value("norm.w")].data = Tensor();
    EXPECT_THROW(verify_graph(g), Error) << "weight without data";
  }
  {
    Graph g = small_graph();
    g.values[g.find_value("w")].shape = {kTokens, Dim::of(16)};
    EXPECT_THROW(verify_graph(g), Error) << "symbolic weight shape";
  }
}

TEST(GraphVerify, CatchesOutputNeverProduced) {
  Graph g = small_graph();
  Value ghost;
  ghost.name = "ghost";
  ghost.shape = tokens_by(32);
  g.values.push_back(ghost);
  g.outputs.push_back(static_cast<int>(g.values.size()) - 1);
  const std::string msg = error_of([&] { verify_graph(g); });
  EXPECT_NE(msg.find("never produced"), std::string::npos) << msg;
  g.outputs.back() = 1000;
  EXPECT_THROW(verify_graph(g), Error) << "output id out of range";
}

TEST(GraphVerify, CatchesInconsistentNodes) {
  {
    Graph g = small_graph();
    g.values[g.find_value("norm")].shape = tokens_by(16);  // not what RMSNorm infers
    EXPECT_THROW(verify_graph(g), Error);
  }
  {
    Graph g = small_graph();
    g.nodes[2].outputs = g.nodes[1].outputs;  // produced twice
    EXPECT_THROW(verify_graph(g), Error);
  }
  {
    Graph g = small_graph();
    g.nodes[1].inputs.push_back(g.find_value("w"));  // RMSNorm takes 2 inputs
    EXPECT_THROW(verify_graph(g), Error);
  }
  {
    Graph g = small_graph();
    g.nodes[0].inputs[0] = 1234;
    EXPECT_THROW(verify_graph(g), Error) << "input id out of range";
  }
  {
    Graph g = small_graph();
    g.inputs.push_back(g.find_value("w"));  // a weight listed as a graph input
    EXPECT_THROW(verify_graph(g), Error);
  }
}

TEST(GraphDump, NamesOpsShapesAndAttributes) {
  Graph g = small_graph();
  const std::string dump = dump_graph(g);
  for (const char* expected : {"graph small", "Linear", "RMSNorm", "Scale", "f32[tokens, 32]",
                               "f32[tokens, 16]", "@w", "@norm.w", "eps=", "scale=0.5", "output"})
    EXPECT_NE(dump.find(expected), std::string::npos) << expected << " missing in:\n" << dump;
  GraphBuilder b("acts");
  const int x = b.input("x", DType::kF32, tokens_by(8));
  b.output(b.activation(b.linear(x, b.weight("w", weight_data({8, 8})), -1, "fc"),
                        Activation::kGeluTanh, "gelu"),
           "y");
  Graph fused = b.finish();
  fuse_linear_activation(fused, Logger(LogLevel::kSilent));
  EXPECT_NE(dump_graph(fused).find("act=gelu_tanh"), std::string::npos) << dump_graph(fused);
}

TEST(GraphShapes, ResolveShapeBindsSymbolsAndRejectsUnbound) {
  const SymShape s = {kTokens, Dim::of(4), Dim::sym("rows")};
  EXPECT_EQ(resolve_shape(s, {{"tokens", 7}, {"rows", 2}}), (Shape{7, 4, 2}));
  const std::string msg = error_of([&] { resolve_shape(s, {{"tokens", 7}}); });
  EXPECT_NE(msg.find("rows"), std::string::npos) << msg;
  EXPECT_EQ(sym_shape_str(s), "[tokens, 4, rows]");
}

TEST(GraphOps, NamesRoundTripForEveryOpKind) {
  for (int i = 0; i < kNumOpKinds; ++i) {
    const auto op = static_cast<OpKind>(i);
    OpKind parsed{};
    ASSERT_TRUE(parse_op_name(op_name(op), &parsed)) << op_name(op);
    EXPECT_EQ(parsed, op);
    EXPECT_EQ(op_schema(op).op, op);
  }
  OpKind unused{};
  EXPECT_FALSE(parse_op_name("Conv", &unused));
}

// ---- JSON -----------------------------------------------------------------------------------

// A graph touching every attribute: fused activation, T5-biased and packed ALiBi attention,
// casts, norms, gather, and a memory plan.
Graph rich_graph() {
  GraphBuilder b("rich");
  const int ids = b.input("input_ids", DType::kI64, {kTokens});
  const int x = b.embedding(b.weight("table", weight_data({50, 12})), ids, "embed");
  const int h = b.layer_norm(x, b.weight("ln.w", weight_data({12})),
                             b.weight("ln.b", weight_data({12})), 1e-5, "ln");
  AttentionAttrs t5 = attn_attrs(AttentionKind::kEncoderSelf, 3, 4);
  t5.bias = PositionBias::kT5Relative;
  t5.num_buckets = 8;
  t5.max_distance = 20;
  t5.layer = 2;
  const int a = b.attention(h, h, h, b.weight("rel", weight_data({8, 3})), t5, "t5_attn");
  AttentionAttrs alibi = attn_attrs(AttentionKind::kCachedSelf, 3, 4);
  alibi.bias = PositionBias::kAlibi;
  alibi.causal = true;
  alibi.packed_qkv = true;
  alibi.scale = 0.5f;
  alibi.bidirectional_buckets = false;
  const int qkv = b.linear(a, b.weight("wqkv", weight_data({36, 12})), -1, "qkv");
  const int c = b.attention(qkv, -1, -1, -1, alibi, "alibi_attn");
  const int up = b.linear(c, b.weight("up.w", weight_data({24, 12})),
                          b.weight("up.b", weight_data({24})), "up");
  const int act = b.activation(up, Activation::kSilu, "silu");
  const int down = b.linear(act, b.weight("down.w", weight_data({12, 24})), -1, "down");
  const int sum = b.add(down, x, "residual");
  const int n = b.rms_norm(sum, b.weight("norm.w", weight_data({12})), 1e-6, "norm");
  const int s = b.scale(n, 0.125f, "scale");
  const int rows = b.gather_rows(s, b.input("rows", DType::kI64, {Dim::sym("rows")}), "gather");
  b.output(b.cast(b.cast(rows, DType::kBF16, "to_bf16"), DType::kF32, "to_f32"), "out");
  b.output(b.softmax(b.gated_activation(s, n, Activation::kGeluExact, "gated"), "softmax"),
           "probs");
  // A LayerNorm that fuse_norm_linear folds into the Linear reading it (CUDA plans).
  const int ln2 = b.layer_norm(s, b.weight("ln2.w", weight_data({12})),
                               b.weight("ln2.b", weight_data({12})), 1e-5, "ln2");
  b.output(b.linear(ln2, b.weight("proj.w", weight_data({6, 12})), -1, "proj"), "projected");
  Graph g = b.finish();
  const Logger quiet(LogLevel::kSilent);
  fuse_linear_activation(g, quiet);
  fuse_add_rms_norm(g, quiet);
  EXPECT_EQ(fuse_norm_linear(g, quiet), 1);
  plan_memory(g, quiet, {{"tokens", 8}, {"rows", 2}});
  // Build-time choices a CUDA plan stores on its Linears (cuda_tactics.cc).
  for (Node& n : g.nodes)
    if (n.name == "up") {
      LinearAttrs& a = n.attr<LinearAttrs>();
      a.tf32 = true;
      a.tactics = {{1, "gemv", "", 3.5f}, {64, "cublaslt", "130100:00ab", 9.25f}};
    }
  return g;
}

struct JsonGraph {
  std::vector<Tensor> blobs;
  nlohmann::json json;
  Graph parse(const std::string& source = "test.plan") const {
    return graph_from_json(
        json, [this](int i, Value& v) { v.data = blobs.at(static_cast<size_t>(i)); }, source);
  }
};

JsonGraph to_json(const Graph& g) {
  JsonGraph j;
  j.json = graph_to_json(g, [&j](const Value& v) {
    j.blobs.push_back(v.data);
    return static_cast<int>(j.blobs.size()) - 1;
  });
  return j;
}

TEST(GraphJson, RoundTripGivesAnIdenticalGraph) {
  const Graph g = rich_graph();
  JsonGraph j = to_json(g);
  j.json = nlohmann::json::parse(j.json.dump());  // through text, as a plan stores it
  const Graph back = j.parse();
  EXPECT_EQ(dump_graph(back), dump_graph(g));
  ASSERT_EQ(back.nodes.size(), g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    EXPECT_EQ(back.nodes[i].op, g.nodes[i].op) << i;
    EXPECT_EQ(back.nodes[i].inputs, g.nodes[i].inputs) << i;
    EXPECT_EQ(back.nodes[i].outputs, g.nodes[i].outputs) << i;
    EXPECT_TRUE(back.nodes[i].attrs == g.nodes[i].attrs) << g.nodes[i].name;
  }
  EXPECT_EQ(back.inputs, g.inputs);
  EXPECT_EQ(back.outputs, g.outputs);
  EXPECT_EQ(back.value_slot, g.value_slot);
  EXPECT_EQ(back.num_slots, g.num_slots);
  for (size_t i = 0; i < g.values.size(); ++i) {
    EXPECT_EQ(back.values[i].kind, g.values[i].kind) << i;
    EXPECT_EQ(back.values[i].producer, g.values[i].producer) << i;
  }
}

using Json = nlohmann::json;

// A small valid graph's JSON, and a way to break one field of it.
class BadInputGraphJson : public testing::Test {
 protected:
  void SetUp() override { good_ = to_json(rich_graph()); }
  // Applies `edit` to a copy and expects graph_from_json to throw a kiln::Error (mentioning
  // `mention`, when given).
  void expect_rejected(const std::function<void(nlohmann::json&)>& edit,
                       const std::string& mention = {}) {
    JsonGraph bad = good_;
    edit(bad.json);
    const std::string msg = error_of([&] { bad.parse("corrupt.plan"); });
    if (!mention.empty()) {
      EXPECT_NE(msg.find(mention), std::string::npos) << msg;
    }
  }
  nlohmann::json& node(nlohmann::json& j, const std::string& name) {
    for (nlohmann::json& n : j["nodes"])
      if (n["name"] == name) return n;
    throw std::runtime_error("no node " + name);
  }
  JsonGraph good_;
};

TEST_F(BadInputGraphJson, GoodGraphParses) { EXPECT_NO_THROW(good_.parse()); }

TEST_F(BadInputGraphJson, BadIds) {
  const int nv = static_cast<int>(good_.json["values"].size());
  expect_rejected([&](Json& j) { node(j, "ln")["inputs"][0] = nv; });
  expect_rejected([&](Json& j) { node(j, "ln")["inputs"][0] = -7; });
  expect_rejected([&](Json& j) { node(j, "ln")["inputs"][0] = -1; }, "ln");  // required input
  expect_rejected([&](Json& j) { node(j, "embed")["outputs"][0] = nv + 5; });
  expect_rejected([&](Json& j) { node(j, "embed")["outputs"][0] = -1; });
  expect_rejected([&](Json& j) { j["outputs"][0] = nv; });
  expect_rejected([&](Json& j) { j["outputs"][0] = -1; });
  expect_rejected([&](Json& j) { j["inputs"][0] = 100000; });
  expect_rejected([&](Json& j) { j["values"][5]["producer"] = 999; });
  expect_rejected([&](Json& j) {  // the ids input turned into a weight
    j["values"][0]["blob"] = 0;
    j["values"][0]["kind"] = 1;
  });
  expect_rejected([&](Json& j) { j["value_slot"].push_back(0); });
  expect_rejected([&](Json& j) { j["value_slot"][3] = j["num_slots"].get<int>(); });
  expect_rejected([&](Json& j) { j["value_slot"][3] = -2; });
  expect_rejected([&](Json& j) { std::swap(j["nodes"][0], j["nodes"][1]); });  // out of order
}

TEST_F(BadInputGraphJson, UnknownOpOrWrongArity) {
  expect_rejected([&](Json& j) { node(j, "ln")["op"] = "Conv"; }, "Conv");
  expect_rejected([&](Json& j) { node(j, "ln")["op"] = "rmsnorm"; });
  expect_rejected([&](Json& j) { node(j, "scale")["inputs"].push_back(0); }, "scale");
  expect_rejected(
      [&](Json& j) { node(j, "residual")["op"] = "Add"; });  // AddRMSNorm has two outputs
}

TEST_F(BadInputGraphJson, BadEnums) {
  // Enums are stored by name: unknown names, and the numbers of the v1 format, are refused.
  expect_rejected([&](Json& j) { node(j, "up")["attrs"]["activation"] = "swish9"; }, "swish9");
  expect_rejected([&](Json& j) { node(j, "up")["attrs"]["activation"] = 1; });
  expect_rejected([&](Json& j) { node(j, "t5_attn")["attrs"]["kind"] = "sideways"; }, "sideways");
  expect_rejected([&](Json& j) { node(j, "t5_attn")["attrs"]["kind"] = 2; });
  expect_rejected([&](Json& j) { node(j, "t5_attn")["attrs"]["bias"] = "rope"; }, "rope");
  expect_rejected([&](Json& j) { node(j, "t5_attn")["attrs"]["num_heads"] = 0; });
  expect_rejected([&](Json& j) { node(j, "t5_attn")["attrs"]["layer"] = -3; });
  expect_rejected([&](Json& j) { node(j, "to_bf16")["attrs"]["to"] = "f128"; }, "f128");
  expect_rejected([&](Json& j) { j["values"][0]["kind"] = "constant"; }, "constant");
  expect_rejected([&](Json& j) { j["values"][0]["kind"] = 0; });
  expect_rejected([&](Json& j) { j["values"][0]["dtype"] = "complex64"; });
  // Tactics: rows ascend and kernels are known.
  expect_rejected([&](Json& j) { node(j, "up")["attrs"]["tactics"][1]["rows"] = 1; }, "tactic");
  expect_rejected([&](Json& j) { node(j, "up")["attrs"]["tactics"][0]["kernel"] = "magic"; },
                  "magic");
  expect_rejected([&](Json& j) { node(j, "up")["attrs"]["tactics"][0].erase("us"); });
  expect_rejected([&](Json& j) { node(j, "up")["attrs"]["tf32"] = "yes"; });
  // A folded input norm: a known kind, a non-negative epsilon, row sums for LayerNorm only.
  expect_rejected([&](Json& j) { node(j, "proj")["attrs"]["norm"] = "batch_norm"; }, "batch_norm");
  expect_rejected([&](Json& j) { node(j, "proj")["attrs"]["norm_eps"] = -1.0; }, "epsilon");
  expect_rejected([&](Json& j) { node(j, "proj")["attrs"].erase("norm_eps"); });
  expect_rejected([&](Json& j) { node(j, "proj")["attrs"]["norm"] = "rms_norm"; }, "no row sums");
  expect_rejected([&](Json& j) { node(j, "proj")["inputs"][5] = -1; }, "row sums");
  expect_rejected([&](Json& j) { node(j, "proj")["attrs"].erase("norm"); },
                  "node 'proj': a linear's norm_eps without its norm");
  expect_rejected(
      [&](Json& j) {
        node(j, "proj")["attrs"].erase("norm");
        node(j, "proj")["attrs"].erase("norm_eps");
      },
      "without a folded");
  // A node holding another op's attributes (a Linear's on an RMSNorm) is refused by name.
  expect_rejected([&](Json& j) { node(j, "ln")["attrs"] = {{"activation", "relu"}}; });
}

TEST_F(BadInputGraphJson, MalformedStructure) {
  expect_rejected([&](Json& j) { j.erase("nodes"); });
  expect_rejected([&](Json& j) { j["inputs"] = "input_ids"; });
  expect_rejected([&](Json& j) { node(j, "ln")["attrs"].erase("eps"); });
  expect_rejected([&](Json& j) { node(j, "ln")["attrs"]["eps"] = "small"; });
  expect_rejected([&](Json& j) { j["values"][0]["shape"] = {{1, 2}}; });
  expect_rejected([&](Json& j) { j = nlohmann::json::array(); });
  expect_rejected([&](Json& j) { j = nlohmann::json(42); });
}

// serialize.h: "errors name `source` and the field" (the design: errors name the file).
TEST_F(BadInputGraphJson, EveryErrorNamesTheSource) {
  const std::pair<const char*, std::function<void(Json&)>> edits[] = {
      {"malformed field", [&](Json& j) { j.erase("nodes"); }},
      {"unknown op", [&](Json& j) { node(j, "ln")["op"] = "Conv"; }},
      {"bad enum", [&](Json& j) { node(j, "up")["attrs"]["activation"] = "swish9"; }},
      {"unknown dtype", [&](Json& j) { node(j, "to_bf16")["attrs"]["to"] = "f128"; }},
      {"node output id -1", [&](Json& j) { node(j, "embed")["outputs"][0] = -1; }},
      {"required input -1", [&](Json& j) { node(j, "ln")["inputs"][0] = -1; }},
      {"nodes out of order", [&](Json& j) { std::swap(j["nodes"][0], j["nodes"][1]); }},
  };
  for (const auto& [what, edit] : edits) {
    JsonGraph bad = good_;
    edit(bad.json);
    const std::string msg = error_of([&] { bad.parse("corrupt.plan"); });
    EXPECT_NE(msg.find("corrupt.plan"), std::string::npos) << what << ": " << msg;
  }
}

TEST_F(BadInputGraphJson, WeightBlobOfTheWrongShape) {
  JsonGraph bad = good_;
  const int table = good_.json["values"][1]["blob"].get<int>();  // "table" [50, 12]
  ASSERT_EQ(good_.json["values"][1]["name"], "table");
  bad.blobs[static_cast<size_t>(table)] = weight_data({12, 50});
  const std::string msg = error_of([&] { bad.parse(); });
  EXPECT_NE(msg.find("table"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kiln
