// parse(): a `kolos` command's options with boost::program_options, --help
// included (launchers/command_options.h).
#include "command_options.h"

#include <iostream>

#include "kolos/core/error.h"

namespace po = boost::program_options;

namespace kolos::cli {

Parsed parse(const std::string& command, const std::vector<std::string>& args,
             const po::options_description& options,
             const po::positional_options_description& positional, const char* synopsis) {
  po::options_description all = options;
  all.add_options()("help,h", "show this help");
  Parsed parsed;
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), parsed.vm);
    if (parsed.vm.count("help")) {
      std::cout << "usage: kolos " << command << " " << synopsis << "\n\n" << all << "\n";
      parsed.help = true;
      return parsed;
    }
    po::notify(parsed.vm);
  } catch (const po::error& e) {
    throw UsageError("kolos " + command + ": " + e.what() + " (see `kolos " + command +
                     " --help`)");
  }
  return parsed;
}

}  // namespace kolos::cli
