// The calibration prompts (`--calib FILE.jsonl`): one JSON value per line, a string or an object
// with a "text" or "prompt" string (the fixture's calib.jsonl and the eval datasets use
// "prompt"), as `kiln run --input` reads them. Read before any model runs: every bad line is
// refused naming path:line.
#pragma once

#include <string>
#include <vector>

namespace kiln {

struct CalibrationPrompt {
  std::string text;
  std::string origin;  // "path:line", for errors
};

// Refuses (usage errors naming path:line) a line that is not JSON, not UTF-8, not a string or
// an object with a "text"/"prompt" string, or whose text is empty; and a file with no prompts
// (naming the file). A missing file is kNotFound.
std::vector<CalibrationPrompt> read_calibration_prompts(const std::string& path);

}  // namespace kiln
