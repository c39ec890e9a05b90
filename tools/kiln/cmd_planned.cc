#include "commands.h"
#include "output.h"

namespace kiln::cli {

Runner add_planned(CLI::App& app, const std::string& name, const std::string& description,
                   const std::string& usage) {
  CLI::App* cmd = app.add_subcommand(name, description + " (not built yet)");
  describe(cmd, "Not built yet in this version of kiln. Usage when done:\n  " + usage);
  cmd->allow_extras();
  cmd->fallthrough(false);  // keep its arguments: they belong to the future subcommand
  return [name](const GlobalOptions&) {
    err("kiln {}: not built yet in this version of kiln (see `kiln {} --help`)\n", name, name);
    return 2;
  };
}

}  // namespace kiln::cli
