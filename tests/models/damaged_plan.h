// Bad-input checks of plans: a built model damaged in memory, written, and read back must be
// refused with a message naming what is wrong (test_precision.cc, test_int4.cc).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/logging.h"
#include "graph/model_ir.h"
#include "plan/plan.h"

namespace kiln::test {

// `damage` applied to a copy of `built`'s first graph; the plan written to `path` must be refused
// by read_plan with a message containing `word`. `what` names the damage in failures.
template <class Damage>
void expect_damaged_plan_refused(const ModelIR& built, const std::string& path, const Logger& log,
                                 Damage&& damage, const std::string& what,
                                 const std::string& word) {
  ModelIR m = built;
  damage(m.graphs[0]);
  write_plan(path, m, PlanBuildInfo{"damaged plan", {}}, Logger(LogLevel::kError));
  try {
    read_plan(path, log);
    ADD_FAILURE() << what << ": the plan was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << what << ": " << e.what();
  }
}

}  // namespace kiln::test
