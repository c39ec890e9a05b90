// The request parameters' one list (request_parameter_names) and RequestParams::set agree: every
// listed name is taken, with a valid value, and a name not listed is not; bad values are
// refused naming the parameter.
#include <gtest/gtest.h>

#include "server/errors.h"
#include "server/generation_service.h"
#include "server/model_repository.h"

namespace kiln::server {
namespace {

nlohmann::json valid_value(const std::string& name) {
  if (name == "ignore_eos" || name == "return_token_ids") return true;
  if (name == "stop" || name == "stop_words") return nlohmann::json::array({"###"});
  if (name == "top_p" || name == "temperature") return 0.5;
  return 1;
}

TEST(RequestParams, EveryListedNameIsTakenAndNoOther) {
  for (const std::string& name : request_parameter_names()) {
    RequestParams p;
    EXPECT_TRUE(p.set(name, valid_value(name))) << name;
    EXPECT_TRUE(is_request_parameter(name)) << name;
  }
  RequestParams p;
  for (const char* other : {"max_tokns", "text_input", "prompt", "", "MAX_TOKENS"}) {
    EXPECT_FALSE(p.set(other, 1)) << other;
    EXPECT_FALSE(is_request_parameter(other)) << other;
  }
}

TEST(RequestParams, BadInputValuesAreRefusedNamingTheParameter) {
  const std::pair<const char*, nlohmann::json> bad[] = {{"max_tokens", 0},
                                                        {"max_tokens", "8"},
                                                        {"temperature", -1},
                                                        {"top_p", 0},
                                                        {"beam_width", 99},
                                                        {"stop", 5},
                                                        {"stop", nlohmann::json::array({""})},
                                                        {"ignore_eos", "yes"},
                                                        {"timeout", -5},
                                                        {"repetition_penalty", 0}};
  for (const auto& [name, value] : bad) {
    RequestParams p;
    try {
      p.set(name, value);
      ADD_FAILURE() << name << " = " << value.dump() << " accepted";
    } catch (const ServerError& e) {
      EXPECT_EQ(e.code(), Code::kBadRequest);
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln::server
