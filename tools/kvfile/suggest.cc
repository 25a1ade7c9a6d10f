// SPDX-License-Identifier: Apache-2.0
// Did-you-mean for unknown verbs (see suggest.h).
#include "suggest.h"

#include <algorithm>
#include <cctype>

#include "cli_common.h"

namespace kvfile::cli {

namespace {

// Optimal string alignment distance: insertions, deletions, substitutions
// and transpositions of adjacent characters each cost one.
size_t Distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string Suggest(std::string_view word, const std::vector<std::string>& candidates) {
  if (word.empty() || word.size() > 64) return "";
  std::string best;
  size_t best_d = std::max<size_t>(1, word.size() / 3) + 1;
  for (const std::string& c : candidates) {
    size_t d = Distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  if (!best.empty()) return best;
  std::string prefixed;
  for (const std::string& c : candidates)
    if (c.starts_with(word)) {
      if (!prefixed.empty()) return "";
      prefixed = c;
    }
  return prefixed;
}

int CheckVerb(const CLI::App& app, int argc, char** argv) {
  std::string verb;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a.starts_with('-') && a.size() > 1) continue;
    verb = a;
    break;
  }
  if (verb.empty()) return -1;
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == verb) return -1;
    if (!sub->get_group().empty()) names.push_back(sub->get_name());
  }
  std::string hint = Suggest(verb, names);
  std::string message = "unknown command '" + verb + "'";
  if (!hint.empty()) {
    message += "; did you mean '" + hint + "'?";
  } else {
    std::string all;
    for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
    message += " (commands: " + all + ")";
  }
  return UsageError(message);
}

std::string ParseErrorLine(const CLI::App& app, const CLI::ParseError& e) {
  std::vector<CLI::App*> parsed = app.get_subcommands();
  if (parsed.empty()) return std::string(e.what()) + " (see kvfile --help)";
  const CLI::App& verb = *parsed.front();
  const std::string help = " (see kvfile " + verb.get_name() + " --help)";
  if (!dynamic_cast<const CLI::ExtrasError*>(&e)) return std::string(e.what()) + help;
  const std::vector<std::string> extras = app.remaining(true);
  auto known = [&](const std::string& flag) {
    return verb.get_option_no_throw(flag) != nullptr || app.get_option_no_throw(flag) != nullptr;
  };
  for (const std::string& arg : extras) {
    bool is_long = arg.starts_with("--") && arg.size() > 2;
    bool is_short = !is_long && arg.size() > 1 && arg[0] == '-' && !std::isdigit(static_cast<unsigned char>(arg[1]));
    if (!is_long && !is_short) continue;
    std::string flag = is_long ? arg.substr(0, arg.find('=')) : arg.substr(0, 2);
    if (known(flag)) continue;
    std::vector<std::string> names{"--help"};
    for (const CLI::App* a : {&verb, &app})
      for (const CLI::Option* o : a->get_options())
        for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    std::string hint = is_long ? Suggest(flag, names) : "";
    return verb.get_name() + ": unknown flag '" + EscapeLine(flag) + "'" +
           (hint.empty() ? "" : "; did you mean '" + hint + "'?") + help;
  }
  std::string all;
  for (const std::string& arg : extras) all += (all.empty() ? "'" : " '") + EscapeLine(arg) + "'";
  return verb.get_name() + ": unexpected argument" + (extras.size() > 1 ? "s " : " ") + all + help;
}

}  // namespace kvfile::cli
