// layering_rules: the include rules of DESIGN §2, as a pure checker over paths and text.
//
// Paths are workspace-relative ("swarm/peer/peer.h"). A quoted include is
// resolved the way the compiler does: first next to the including file (when
// that file is one of the known sources), else from the workspace root. An
// angle include is checked only when it names a project path
// (<swarm/...>, <transports/...>, ...), so `#include <vector>` is never a
// project include, and third-party headers are outside these rules.
//
// The rules (a name, and what breaks it):
//   swarm-is-a-library        a file under swarm/ includes transports/, models/, kernels/ or apps/.
//   trainer-peer-independent  swarm/trainer includes swarm/peer, or swarm/peer includes swarm/trainer.
//   runtime-uses-concepts     a runtime (swarm/peer, swarm/trainer, swarm/averaging) includes a
//                             registry or transport implementation (swarm/registry, transports/)
//                             or any implementation package (swarm/compression, swarm/wiring,
//                             swarm/security, models/, kernels/).
//   kernels-see-core-and-api  kernels/ includes a swarm/ package other than swarm/core, swarm/api.
//   api-is-concepts-only      swarm/api includes a project path outside swarm/core, swarm/api.
//   core-is-the-bottom        swarm/core includes a project path outside swarm/core.
//   impl-never-sees-runtime   an implementation (transports/, swarm/registry, swarm/compression,
//                             swarm/wiring, swarm/security, kernels/, models/) includes a runtime.
//   policy-is-pure            swarm/rebalance includes a project path outside swarm/core and itself:
//                             the same policy runs in peers, tests and swarm/sim.
// bench/ and tests/ are exempt: they may include anything.
#pragma once

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace swarm::layering {

// True when `path` is `dir` itself or lies below it.
inline bool under(std::string_view path, std::string_view dir) {
  return path.size() > dir.size() && path.substr(0, dir.size()) == dir && path[dir.size()] == '/';
}

inline bool under_any(std::string_view path, std::initializer_list<std::string_view> dirs) {
  return std::any_of(dirs.begin(), dirs.end(), [&](std::string_view d) { return under(path, d); });
}

// The top-level folders of the workspace: an include below one of them is a project include.
inline bool is_project_path(std::string_view path) {
  return under_any(path, {"swarm", "transports", "kernels", "models", "apps", "bench", "tests", "tools",
                          "third_party"});
}

inline bool is_runtime(std::string_view path) {
  return under_any(path, {"swarm/peer", "swarm/trainer", "swarm/averaging"});
}

inline bool is_implementation(std::string_view path) {
  return under_any(path, {"transports", "swarm/registry", "swarm/compression", "swarm/wiring", "swarm/security",
                          "kernels", "models"});
}

struct Rule {
  std::string_view name;
  std::string_view description;
  // from: the including file; to: the resolved project path it includes.
  bool (*breaks)(std::string_view from, std::string_view to);
};

inline const std::vector<Rule>& rules() {
  static const std::vector<Rule> all = {
      {"swarm-is-a-library", "swarm/ must not include transports/, models/, kernels/ or apps/",
       [](std::string_view from, std::string_view to) {
         return under(from, "swarm") && under_any(to, {"transports", "models", "kernels", "apps"});
       }},
      {"trainer-peer-independent", "swarm/trainer and swarm/peer must not include each other",
       [](std::string_view from, std::string_view to) {
         return (under(from, "swarm/trainer") && under(to, "swarm/peer")) ||
                (under(from, "swarm/peer") && under(to, "swarm/trainer"));
       }},
      {"runtime-uses-concepts",
       "a runtime (swarm/peer, swarm/trainer, swarm/averaging) must not include an implementation "
       "(swarm/registry, transports/, swarm/compression, swarm/wiring, models/, kernels/)",
       [](std::string_view from, std::string_view to) { return is_runtime(from) && is_implementation(to); }},
      {"kernels-see-core-and-api", "kernels/ may include only swarm/core and swarm/api from swarm/",
       [](std::string_view from, std::string_view to) {
         return under(from, "kernels") && under(to, "swarm") && !under_any(to, {"swarm/core", "swarm/api"});
       }},
      {"api-is-concepts-only", "swarm/api may include only swarm/core and swarm/api",
       [](std::string_view from, std::string_view to) {
         return under(from, "swarm/api") && !under_any(to, {"swarm/core", "swarm/api"});
       }},
      {"core-is-the-bottom", "swarm/core may include only swarm/core",
       [](std::string_view from, std::string_view to) {
         return under(from, "swarm/core") && !under(to, "swarm/core");
       }},
      {"impl-never-sees-runtime",
       "an implementation (transports/, swarm/registry, swarm/compression, swarm/wiring, kernels/, "
       "models/) must not include a runtime (swarm/peer, swarm/trainer, swarm/averaging)",
       [](std::string_view from, std::string_view to) { return is_implementation(from) && is_runtime(to); }},
      {"policy-is-pure", "swarm/rebalance may include only swarm/core and swarm/rebalance",
       [](std::string_view from, std::string_view to) {
         return under(from, "swarm/rebalance") && !under_any(to, {"swarm/core", "swarm/rebalance"});
       }},
  };
  return all;
}

// The names of the rules that `from` including the project path `to` breaks (often none).
inline std::vector<std::string_view> broken_rules(std::string_view from, std::string_view to) {
  std::vector<std::string_view> out;
  if (under_any(from, {"bench", "tests"}) || !is_project_path(to)) return out;
  for (const Rule& rule : rules()) {
    if (rule.breaks(from, to)) out.push_back(rule.name);
  }
  return out;
}

struct Include {
  int line = 0;            // 1-based
  std::string spelled;     // as written between the quotes or brackets
  bool quoted = true;      // "..." rather than <...>
};

// The #include directives of a source text, skipping // and /* */ comments
// (a commented-out include is no include) and the insides of string literals.
inline std::vector<Include> parse_includes(std::string_view text) {
  std::vector<Include> out;
  bool in_block_comment = false;
  int line_number = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    ++line_number;
    // The line with comments blanked out.
    std::string code;
    for (size_t i = 0; i < line.size();) {
      if (in_block_comment) {
        size_t close = line.find("*/", i);
        if (close == std::string_view::npos) break;
        in_block_comment = false;
        i = close + 2;
        code += ' ';
      } else if (line.compare(i, 2, "//") == 0) {
        break;
      } else if (line.compare(i, 2, "/*") == 0) {
        in_block_comment = true;
        i += 2;
      } else if (line[i] == '"' || line[i] == '\'') {
        const char quote = line[i];
        code += line[i++];
        while (i < line.size() && line[i] != quote) {
          if (line[i] == '\\' && i + 1 < line.size()) code += line[i++];
          code += line[i++];
        }
        if (i < line.size()) code += line[i++];
      } else {
        code += line[i++];
      }
    }
    // #  include  "path"  or  <path>
    size_t i = code.find_first_not_of(" \t");
    if (i != std::string::npos && code[i] == '#') {
      i = code.find_first_not_of(" \t", i + 1);
      if (i != std::string::npos && code.compare(i, 7, "include") == 0) {
        i = code.find_first_not_of(" \t", i + 7);
        if (i != std::string::npos && (code[i] == '"' || code[i] == '<')) {
          const char close = code[i] == '"' ? '"' : '>';
          size_t stop = code.find(close, i + 1);
          if (stop != std::string::npos) {
            out.push_back({line_number, code.substr(i + 1, stop - i - 1), close == '"'});
          }
        }
      }
    }
    pos = end + 1;
  }
  return out;
}

// The workspace path an include names, or "" when it names no project file.
inline std::string resolve(std::string_view from, const Include& include, const std::set<std::string>& known) {
  namespace fs = std::filesystem;
  if (include.quoted) {
    std::string beside = fs::path(std::string(from)).parent_path().append(include.spelled).lexically_normal().generic_string();
    if (known.count(beside) != 0) return beside;
  }
  std::string rooted = fs::path(include.spelled).lexically_normal().generic_string();
  return is_project_path(rooted) ? rooted : "";
}

struct Violation {
  std::string file;
  int line = 0;
  std::string include;  // the resolved path
  std::string_view rule;

  std::string describe() const {
    std::string description;
    for (const Rule& r : rules()) {
      if (r.name == rule) description = std::string(r.description);
    }
    return file + ":" + std::to_string(line) + ": includes \"" + include + "\": " + std::string(rule) + " (" +
           description + ")";
  }
};

// Every rule the text of `file` breaks. `known` is the set of sources, for resolving includes
// relative to the including file.
inline std::vector<Violation> check_file(const std::string& file, std::string_view text,
                                         const std::set<std::string>& known = {}) {
  std::vector<Violation> out;
  for (const Include& include : parse_includes(text)) {
    const std::string target = resolve(file, include, known);
    if (target.empty()) continue;
    for (std::string_view rule : broken_rules(file, target)) out.push_back({file, include.line, target, rule});
  }
  return out;
}

}  // namespace swarm::layering
