// Decoding of client bytes in the gRPC frontend's tensors: Triton's raw BYTES encoding (a
// 4-byte little-endian length before each element), shapes and parameter tensors. BadInput*:
// `make asan` runs these under AddressSanitizer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/errors.h"
#include "server/grpc_tensors.h"

namespace kiln::server {
namespace {

std::string le32(uint32_t n) {
  return std::string{static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                     static_cast<char>((n >> 16) & 0xff), static_cast<char>(n >> 24)};
}

// The message of the kBadRequest error `f` throws ("" when it does not throw one).
template <typename F>
std::string bad_request(F&& f) {
  try {
    f();
  } catch (const ServerError& e) {
    EXPECT_EQ(e.code(), Code::kBadRequest) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no ServerError thrown";
  return "";
}

TEST(BadInputGrpcTensors, RawBytesExactBufferDecodes) {
  const std::string raw = le32(5) + "hello" + le32(0) + le32(3) + std::string("a\0b", 3);
  const auto v = decode_raw_bytes(raw, 3, "text_input");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0], "hello");
  EXPECT_EQ(v[1], "");
  EXPECT_EQ(v[2], std::string("a\0b", 3));
  EXPECT_EQ(encode_raw_bytes(v), raw);
}

TEST(BadInputGrpcTensors, RawBytesEmptyBufferIsZeroElementsOnly) {
  EXPECT_TRUE(decode_raw_bytes("", 0, "text_input").empty());
  const std::string msg = bad_request([] { decode_raw_bytes("", 1, "text_input"); });
  EXPECT_NE(msg.find("text_input"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4-byte length"), std::string::npos) << msg;
}

TEST(BadInputGrpcTensors, RawBytesTruncatedLengthPrefixIsRefused) {
  for (size_t n = 1; n < 4; ++n) {
    const std::string raw = le32(0).substr(0, n);
    const std::string msg = bad_request([&] { decode_raw_bytes(raw, 1, "prompt"); });
    EXPECT_NE(msg.find("prompt"), std::string::npos) << msg;
  }
  // A second element whose length is cut.
  const std::string raw = le32(1) + "x" + std::string("\x01\x00", 2);
  EXPECT_NE(bad_request([&] { decode_raw_bytes(raw, 2, "prompt"); }).find("element 1"),
            std::string::npos);
}

TEST(BadInputGrpcTensors, RawBytesLengthPastTheBufferIsRefused) {
  // One byte short, and lengths that would overflow an offset if added before comparing.
  for (uint32_t length : {6u, 0x7fffffffu, 0xfffffffcu, 0xffffffffu}) {
    const std::string raw = le32(length) + "hello";
    const std::string msg = bad_request([&] { decode_raw_bytes(raw, 1, "text_input"); });
    EXPECT_NE(msg.find("text_input"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(length)), std::string::npos) << msg;
  }
}

TEST(BadInputGrpcTensors, RawBytesLeftOverOrMissingElementsAreRefused) {
  const std::string two = le32(1) + "a" + le32(1) + "b";
  EXPECT_NE(bad_request([&] { decode_raw_bytes(two, 1, "t"); }).find("5 bytes after"),
            std::string::npos);
  EXPECT_NE(bad_request([&] { decode_raw_bytes(two, 3, "t"); }).find("element 2"),
            std::string::npos);
  EXPECT_NE(bad_request([&] { decode_raw_bytes(two + "z", 2, "t"); }).find("1 bytes after"),
            std::string::npos);
}

TEST(BadInputGrpcTensors, ShapesWithNegativeOrHugeDimensionsAreRefused) {
  google::protobuf::RepeatedField<int64_t> shape;
  EXPECT_EQ(element_count(shape, "t"), 1);  // a scalar
  shape.Add(3);
  shape.Add(2);
  EXPECT_EQ(element_count(shape, "t"), 6);
  shape.Add(0);
  EXPECT_EQ(element_count(shape, "t"), 0);
  google::protobuf::RepeatedField<int64_t> negative;
  negative.Add(-1);
  EXPECT_NE(bad_request([&] { element_count(negative, "t"); }).find("negative"), std::string::npos);
  google::protobuf::RepeatedField<int64_t> huge;
  huge.Add(int64_t{1} << 40);
  huge.Add(int64_t{1} << 40);
  EXPECT_NE(bad_request([&] { element_count(huge, "t"); }).find("more than"), std::string::npos);
}

TEST(BadInputGrpcTensors, BytesTensorCountMustMatchItsShape) {
  InferInput in;
  in.set_name("text_input");
  in.set_datatype("BYTES");
  in.add_shape(2);
  in.mutable_contents()->add_bytes_contents("one");
  EXPECT_NE(bad_request([&] { bytes_elements(in, nullptr); }).find("2 elements"),
            std::string::npos);
  in.mutable_contents()->add_bytes_contents("two");
  EXPECT_EQ(bytes_elements(in, nullptr), (std::vector<std::string>{"one", "two"}));
  const std::string raw = encode_raw_bytes({"x", "y"});
  EXPECT_EQ(bytes_elements(in, &raw), (std::vector<std::string>{"x", "y"}));
  in.set_datatype("INT32");
  EXPECT_NE(bad_request([&] { bytes_elements(in, nullptr); }).find("expected BYTES"),
            std::string::npos);
}

TEST(BadInputGrpcTensors, ParameterTensorsReadEachDatatype) {
  InferInput in;
  in.set_name("max_tokens");
  in.add_shape(1);
  in.set_datatype("INT32");
  in.mutable_contents()->add_int_contents(-7);
  EXPECT_EQ(parameter_tensor_value(in, nullptr), nlohmann::json(-7));
  const std::string raw_i32 = le32(static_cast<uint32_t>(-7));
  EXPECT_EQ(parameter_tensor_value(in, &raw_i32), nlohmann::json(-7));
  in.set_datatype("UINT64");
  in.clear_contents();
  in.mutable_contents()->add_uint64_contents(~uint64_t{0});
  EXPECT_EQ(parameter_tensor_value(in, nullptr), nlohmann::json(~uint64_t{0}));
  in.set_datatype("FP32");
  in.clear_contents();
  in.mutable_contents()->add_fp32_contents(0.5f);
  EXPECT_EQ(parameter_tensor_value(in, nullptr), nlohmann::json(0.5));
  in.set_datatype("BOOL");
  const std::string raw_bool("\x01", 1);
  EXPECT_EQ(parameter_tensor_value(in, &raw_bool), nlohmann::json(true));
  in.set_name("stop");
  in.set_datatype("BYTES");
  const std::string raw_stop = encode_raw_bytes({"\n"});
  EXPECT_EQ(parameter_tensor_value(in, &raw_stop), nlohmann::json::array({"\n"}));
}

TEST(BadInputGrpcTensors, ParameterTensorsOfWrongSizeOrTypeAreRefused) {
  InferInput in;
  in.set_name("temperature");
  in.set_datatype("FP32");
  in.add_shape(2);
  EXPECT_NE(bad_request([&] { parameter_tensor_value(in, nullptr); }).find("temperature"),
            std::string::npos);
  in.set_shape(0, 1);
  EXPECT_NE(bad_request([&] { parameter_tensor_value(in, nullptr); }).find("got 0"),
            std::string::npos);
  const std::string three_bytes("\x00\x00\x80", 3);
  EXPECT_NE(bad_request([&] { parameter_tensor_value(in, &three_bytes); }).find("3 bytes"),
            std::string::npos);
  in.set_datatype("FP16");
  EXPECT_NE(bad_request([&] { parameter_tensor_value(in, nullptr); }).find("FP16"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln::server
