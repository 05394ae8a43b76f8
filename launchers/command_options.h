// A `kolos` command's options: parse() reads them with
// boost::program_options, answers --help, and turns a bad option into a
// UsageError that names the command (launchers/command_options.cpp).
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace kolos::cli {

struct Parsed {
  boost::program_options::variables_map vm;
  bool help = false;
};

// `args` (those after the command's name) against `options` and
// `positional`; with --help prints "usage: kolos COMMAND SYNOPSIS" and the
// options, and returns with `help` set.
Parsed parse(const std::string& command, const std::vector<std::string>& args,
             const boost::program_options::options_description& options,
             const boost::program_options::positional_options_description& positional,
             const char* synopsis);

}  // namespace kolos::cli
